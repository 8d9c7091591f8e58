# Reloads while requests are counted and synced to a real root: every
# admitted request reaches the root exactly once. During a reload the old
# and the new worker 0 both run a sync thread for a while; deltas leave
# the shared table atomically, and a stopping thread hands back what no
# root acknowledged, so nothing is lost or counted twice.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use HTTP::Tiny;
use SluiceTest qw(start_root stop_root root_call reload_nginx wait_until);

our $Root = start_root();
END { stop_root($Root) }
$ENV{TEST_NGINX_ROOT_URL} = $Root->{url};

master_on();
workers(2);
no_shuffle();
run_tests();

__DATA__

=== TEST 1: 100 requests across 5 reloads are counted 100 times at the root
--- main_config
load_module $TEST_NGINX_SLUICE_MODULE;
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
--- config
location /c/ { alias html/; sluice counted; }
--- init
my ($status) = SluiceTest::root_call($main::Root, 'PUT', '/v1/quotas/counted',
    { limit => 0, low_burst => 1e9, high_burst => 1e9 });
Test::More::ok($status >= 200 && $status < 300, "quota created ($status)");
sleep 1.5;
my $http = HTTP::Tiny->new(keep_alive => 0, timeout => 5);
my $url = "http://127.0.0.1:" . server_port() . "/c/index.html";
my $passed = 0;
for my $round (1 .. 5) {
    for (1 .. 20) {
        $passed++ if $http->get($url)->{status} == 200;
    }
    main::reload_nginx(server_root(), 0.3);
}
Test::More::is($passed, 100, 'every request passed');
my $level;
main::wait_until(sub {
    (undef, my $q) = SluiceTest::root_call($main::Root, 'GET', '/v1/quotas/counted');
    $level = $q->{level};
    defined $level && $level >= 100;
}, 10);
sleep 1;    # anything counted twice would arrive by now
(undef, my $q) = SluiceTest::root_call($main::Root, 'GET', '/v1/quotas/counted');
Test::More::is($q->{level}, 100, 'the root counted each request once');
--- request
GET /c/index.html
--- error_code: 200
