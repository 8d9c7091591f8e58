# Keys over this nginx's share at its root (issue 34, case 4): a root
# that holds at most 100 keys of any one limiter (max_keys_per_limiter),
# a spray of throwaway keys that uses the share up, then key `late`, 36
# checks over twelve syncs of a 10-a-day quota: the root refuses `late`,
# and nginx keeps its count (10 pass; 30 of 36 did, its count started
# again at every sync). Failed logins of another template, refused too
# after the spray, are counted as well (5 of 25 pass). The refusals show
# in sluice_key_refused_total and the error log. With
# `sluice_key_overflow pass` a refused key is held to its own count only
# (`shared`, the default, holds it to its template's counter too: see
# tests/sync_key_share.rs).
#
# A plain Test::More file (a root and an nginx), so it runs the same under
# upstream Test::Nginx and under the runner in t/lib.

use strict;
use warnings;

use FindBin ();
use lib "$FindBin::Bin/helpers";
use File::Temp ();
use JSON::PP ();
use Test::More;
use Time::HiRes qw(sleep);
use SluiceTest qw(free_port start_root stop_root root_call http_request start_nginx wait_until);

# Throwaway keys enough to fill the share in every shard of a root on
# this machine: it splits a share over 4 shards a core (a power of two,
# 4 to 256), with an eighth and one more a shard.
my $cores = `nproc` + 0 || 1;
my $shards = 4;
$shards *= 2 while $shards < $cores * 4 && $shards < 256;
my $even = int((100 + $shards - 1) / $shards);
my $spray = 4 * $shards * ($even + int($even / 8) + 1);
$spray = 300 if $spray < 300;

my $dir = File::Temp::tempdir(CLEANUP => 1);
open my $fh, '>', "$dir/root.toml" or die $!;
print $fh "max_keys_per_limiter = 100\n";
close $fh;
my $root = start_root(args => ['--config', "$dir/root.toml"]);
my $nginx;
END {
    $nginx->{stop}->() if $nginx;
    stop_root($root);
}

my ($status) = root_call($root, 'PUT', '/v1/quotas/daily',
    { limit => 10, window => '1d', per_key => JSON::PP::true });
is($status, 201, 'a 10-a-day template at the root');
($status) = root_call($root, 'PUT', '/v1/quotas/logins',
    { limit => 5, window => '1h', per_key => JSON::PP::true });
is($status, 201, 'a failed-logins template at the root');

my $port = free_port();
$nginx = start_nginx(
    http => <<"EOF",
    sluice_root $root->{url};
    sluice_sync_interval 200ms;
    sluice_key_overflow pass;
    server {
        listen 127.0.0.1:$port;
        location /d/ { sluice daily key=\$arg_k; root html; }
        location /login/ { sluice logins key=\$arg_k; root html; }
        location = /metrics { sluice_metrics; }
    }
EOF
    files => { 'd/x' => "x\n", 'login/x' => "x\n" },
);

sub get {
    my ($path) = @_;
    return http_request('GET', "http://127.0.0.1:$port$path")->{status};
}

# Held: a key's 11th check of the day is refused (before the quotas
# arrive, an unknown name passes uncounted).
my $probe = 0;
ok(wait_until(sub {
    $probe++;
    my @s = map { get("/d/x?k=probe$probe") } 1 .. 11;
    $s[-1] == 429;
}, 15), 'nginx holds the templates');

get("/d/x?k=junk$_") for 1 .. $spray;
sleep 0.6;

# Two syncs or more between rounds: a count a reply would reset is reset
# before the next round.
sub offer {
    my ($path, $rounds, $per_round) = @_;
    my $passed = 0;
    for (1 .. $rounds) {
        $passed += grep { get($path) == 200 } 1 .. $per_round;
        sleep 0.45;
    }
    return $passed;
}

is(offer('/d/x?k=late', 12, 3), 10, "late: 10 of 36 pass on a 10-a-day quota ($spray throwaway keys before)");
is(offer('/login/x?k=alice', 5, 5), 5, "alice's failed logins: 5 of 25 pass after the spray");

my $text = http_request('GET', "http://127.0.0.1:$port/metrics")->{content};
my ($refused) = $text =~ /^sluice_key_refused_total(?:\{[^}]*\})? (\S+)$/m;
ok(defined $refused && $refused >= 12, 'sluice_key_refused_total counts the refusals')
    or diag $refused // 'absent';

my $log = do { local (@ARGV, $/) = "$nginx->{prefix}/logs/error.log"; <> };
like($log, qr/keys refused: a quota root refused to hold \d+ key/, 'the error log says so');

done_testing();
