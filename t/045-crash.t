# A crashed worker 0 is respawned by the master and starts the sync thread
# again; the table, shared with the master, keeps its quotas and counters.
#
# The worker running the sync thread is found by its thread's name
# ("sluice-sync") in /proc, killed with SIGKILL, and its replacement is
# expected to run a sync thread of its own.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use SluiceTest qw(nginx_pid wait_until);

master_on();
workers(2);
no_shuffle();
run_tests();

# Pids of the master's children that run a thread named sluice-sync.
sub sync_workers {
    my $master = nginx_pid(server_root());
    my @workers = grep {
        open my $st, '<', "/proc/$_/stat" or next;
        my ($ppid) = (split ' ', scalar <$st>)[3];
        $ppid == $master;
    } map { m{/proc/(\d+)$} ? $1 : () } glob '/proc/[0-9]*';
    return grep {
        my $pid = $_;
        grep {
            open my $c, '<', "$_/comm" or next;
            my $name = <$c> // '';
            $name =~ /^sluice-sync/;
        } glob "/proc/$pid/task/*";
    } @workers;
}

__DATA__

=== TEST 1: one worker syncs; one unit of the quota is used
--- main_config
load_module $TEST_NGINX_SLUICE_MODULE;
--- http_config
sluice_zone 1m;
sluice_quotas ../html/quotas.json;
--- config
location /q/ { alias html/; sluice q; }
--- user_files
>>> quotas.json
[{"name": "q", "limit": 0, "low_burst": 2, "high_burst": 2}]
--- init
my @sync;
main::wait_until(sub { @sync = main::sync_workers(); @sync >= 1 }, 10);
sleep 0.5;    # the other worker has started too: still only one syncs
@sync = main::sync_workers();
Test::More::is(scalar @sync, 1, 'exactly one worker runs the sync thread');
$main::Killed = $sync[0] // 0;
--- request
GET /q/index.html



=== TEST 2: after worker 0 is killed, its replacement syncs and the counter is intact
--- init
kill 'KILL', $main::Killed;
my $respawned = main::wait_until(sub {
    my @sync = main::sync_workers();
    @sync == 1 && $sync[0] != $main::Killed;
}, 10);
Test::More::ok($respawned, 'a new worker runs the sync thread');
--- request
GET /q/index.html
--- error_code: 200
--- error_log eval
qr/worker process \d+ exited on signal 9/



=== TEST 3: the quota's two units are used up
--- request
GET /q/index.html
--- error_code: 429
