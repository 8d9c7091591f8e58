# A root group added by a config change and a reload: the counter whose
# shard moves to the new group goes there from the reload on, every
# admitted request reaches the roots exactly once (the old worker hands
# back what the old group did not acknowledge), and the old group keeps
# what it had. Quota "counted" is the database's first quota (id 1),
# whose shard of two is 1 (`sluice::sync::shard`).

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use HTTP::Tiny;
use SluiceTest qw(start_root stop_root root_call reload_nginx wait_until);

our $A = start_root();
our $B = start_root(dir => $A->{dir});
END { stop_root($A); stop_root($B) }
$ENV{TEST_NGINX_ROOT_A} = $A->{url};

master_on();
workers(2);
no_shuffle();
run_tests();

__DATA__

=== TEST 1: a group added by reload takes the moved counter, counted once
--- main_config
load_module $TEST_NGINX_SLUICE_MODULE;
--- http_config
sluice_root $TEST_NGINX_ROOT_A;
sluice_sync_interval 200ms;
--- config
location /c/ { alias html/; sluice counted; }
--- init
my ($status) = SluiceTest::root_call($main::A, 'PUT', '/v1/quotas/counted',
    { limit => 0, low_burst => 1e9, high_burst => 1e9 });
Test::More::ok($status >= 200 && $status < 300, "quota created ($status)");
my (undef, $q) = SluiceTest::root_call($main::A, 'GET', '/v1/quotas/counted');
Test::More::is($q->{id}, 1, 'the first quota has id 1 (shard 1 of 2)');
sleep 1.5;
my $http = HTTP::Tiny->new(keep_alive => 0, timeout => 5);
my $url = "http://127.0.0.1:" . server_port() . "/c/index.html";
my $level = sub {
    my ($root) = @_;
    my (undef, $q) = SluiceTest::root_call($root, 'GET', '/v1/quotas/counted');
    return $q->{level} // 0;
};
my $passed = 0;
for (1 .. 20) { $passed++ if $http->get($url)->{status} == 200 }
main::wait_until(sub { $level->($main::A) >= 20 }, 10);
Test::More::is($level->($main::A), 20, 'one group: root A counted 20');
# The config gains group 1 (root B), then nginx reloads.
my $conf = server_root() . '/conf/nginx.conf';
open my $in, '<', $conf or die "$conf: $!";
my $text = do { local $/; <$in> };
close $in;
my $a = $main::A->{url};
my $b = $main::B->{url};
$text =~ s{sluice_root \Q$a\E;}{sluice_root $a;\nsluice_root $b group=1;} or die 'no sluice_root';
open my $out, '>', $conf or die "$conf: $!";
print $out $text;
close $out;
main::reload_nginx(server_root(), 1.0);
for (1 .. 20) { $passed++ if $http->get($url)->{status} == 200 }
Test::More::is($passed, 40, 'every request passed');
main::wait_until(sub { $level->($main::B) >= 20 }, 10);
sleep 1;    # anything counted twice would arrive by now
Test::More::is($level->($main::B), 20, 'the new group counted the 20 after the reload, once');
Test::More::is($level->($main::A), 20, 'the old group got nothing more');
--- request
GET /c/index.html
--- error_code: 200



=== TEST 2: a group whose every root is down is counted in sluice_sync_groups_down, the rest synced fleet-wide
--- main_config
load_module $TEST_NGINX_SLUICE_MODULE;
--- http_config
sluice_root $TEST_NGINX_ROOT_A;
sluice_root http://127.0.0.1:1 group=1;
sluice_sync_interval 200ms;
--- config
location = /m { sluice_metrics; }
--- init
sleep 1.5;    # several cycles: group 1 down for two intervals
--- request
GET /m
--- response_body_like eval
qr/^sluice_sync_all_roots_down 0\n.*^sluice_sync_groups_down 1$/ms
--- error_log
every quota root of group 1 unreachable
