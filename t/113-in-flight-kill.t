# In-flight slots held by workers killed with SIGKILL come back: each slot
# a request takes is recorded in the zone with its worker's pid and start
# time, and the sync thread (in the respawned worker 0) gives back the
# slots of processes that died, standalone and to a real `sluice root`.
#
# An in-flight quota of 2, two slow requests hold both slots (a proxied
# location of this nginx sending 60 KB at 30 KB/s), every worker is
# killed with SIGKILL, and within 5 s of the kill new requests pass again
# (before, they were refused for good: the slots lived only in the killed
# workers' request pools). With a root, the root's level goes back to 0.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use Time::HiRes qw(time sleep);
use JSON::PP ();
use SluiceTest qw(nginx_pid wait_until start_root stop_root root_call);

our $Root = start_root();
END { stop_root($Root) }
$ENV{TEST_NGINX_ROOT_URL} = $Root->{url};

our $Slow = <<'CONF';
location /slow { sluice uploads; proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend/; }
location /backend/ { alias html/; limit_rate 30k; }
location /fast/ { alias html/; sluice uploads; }
location = /metrics { sluice_metrics; }
CONF

add_block_preprocessor(sub {
    my $block = shift;
    SluiceTest::load_sluice_module($block);
    $block->set_value(config => $Slow);
    $block->set_value(user_files => ">>> quotas.json\n"
        . qq{{"quotas": [{"name": "uploads", "limit": 2, "in_flight": true}]}\n}
        . ">>> big.bin\n" . ('x' x 60000) . "\n>>> small.txt\nsmall\n");
});

master_on();
workers(2);
worker_connections(256);
no_root_location();
no_shuffle();
run_tests();

sub port { Test::Nginx::Socket::server_port() }

# The pids of the master's worker processes.
sub workers_of_master {
    my $master = nginx_pid(server_root());
    return grep {
        my $line = '';
        if (open my $st, '<', "/proc/$_/stat") { $line = <$st> // '' }
        $line =~ s/^.*\)\s+//;
        ((split ' ', $line)[1] // 0) == $master;
    } map { m{/proc/(\d+)$} ? $1 : () } glob '/proc/[0-9]*';
}

# Two slow requests, each holding a slot once its response headers
# arrived; returns their sockets, still reading.
sub hold_two {
    my @socks = SluiceTest::send_and_keep(port(), '/slow/big.bin', 2);
    for my $s (@socks) {
        local $/ = "\r\n\r\n";
        my $head = <$s> // '';
        die "no response headers: $head" unless $head =~ m{^HTTP/1\.1 200};
    }
    return @socks;
}

# The status of one quick request through the quota (0: no answer).
sub fast_status {
    my $res = eval { SluiceTest::http_request('GET', 'http://127.0.0.1:' . port() . '/fast/small.txt') };
    return $res ? $res->{status} // 0 : 0;
}

# Holds both slots, checks a third request is refused, kills every worker
# with SIGKILL; returns the time of the kill.
sub hold_both_and_kill {
    my ($before_kill) = @_;
    my @held = hold_two();
    Test::More::is(fast_status(), 429, 'a third request is refused while two hold the slots');
    $before_kill->() if $before_kill;
    my @before = workers_of_master();
    Test::More::ok(scalar @before >= 2, "the workers: @before");
    kill 'KILL', @before;
    my $killed = time;
    close $_ for @held;
    my $respawned = wait_until(sub {
        my @now = workers_of_master();
        my %old = map { $_ => 1 } @before;
        @now >= 2 && !grep { $old{$_} } @now;
    }, 10);
    Test::More::ok($respawned, 'the master respawned the workers');
    return $killed;
}

# Polls until a quick request passes; returns the seconds after $since.
sub passes_after {
    my ($since) = @_;
    wait_until(sub { fast_status() == 200 }, 15);
    return time - $since;
}

# The quota's level at the root (-1 when the root does not answer for it).
sub root_level {
    my ($status, $quota) = root_call($main::Root, 'GET', '/v1/quotas/uploads');
    return $status == 200 ? $quota->{level} // 0 : -1;
}

__DATA__

=== TEST 1: standalone: slots of workers killed with SIGKILL are free again within 5 s
--- http_config
sluice_zone 1m;
sluice_quotas ../html/quotas.json;
--- init
my $killed = main::hold_both_and_kill();
my $took = main::passes_after($killed);
Test::More::ok($took <= 5, sprintf('a request passes %.1f s after the kill', $took));
my @two = (main::fast_status(), main::fast_status());
Test::More::is_deeply(\@two, [200, 200], 'and the two slots take requests again');
sleep 0.5;    # the sync thread's log lines reach the error log on a 200 ms timer
--- request
GET /metrics
--- response_body_like
sluice_in_flight_slots\{quota="uploads"\} 0
--- error_log eval
qr/gave back [12] in-flight slot\(s\) held by processes that died/



=== TEST 2: with a root: the root's level goes back to 0 and requests pass within 5 s
--- http_config
sluice_zone 1m;
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
sluice_host_id t-kill;
--- init
my ($status) = SluiceTest::root_call($main::Root, 'PUT', '/v1/quotas/uploads',
    { limit => 2, in_flight => JSON::PP::true });
Test::More::ok($status >= 200 && $status < 300, "the root took the quota ($status)");
Test::More::ok(main::wait_until(sub {
    defined SluiceTest::metric_value(main::port(), '/metrics', 'sluice_in_flight_slots{quota="uploads"}');
}, 5), 'nginx knows the quota');
my $killed = main::hold_both_and_kill(sub {
    Test::More::ok(main::wait_until(sub { main::root_level() == 2 }, 5),
        'the root counts both slots before the kill');
});
Test::More::ok(main::wait_until(sub { main::root_level() == 0 }, 5),
    'the root counts none of the dead workers\' slots within 5 s');
my $took = main::passes_after($killed);
Test::More::ok($took <= 5, sprintf('a request passes %.1f s after the kill', $took));
sleep 0.5;    # the sync thread's log lines reach the error log on a 200 ms timer
--- request
GET /fast/small.txt
--- error_code: 200
--- error_log eval
qr/gave back [12] in-flight slot\(s\) held by processes that died/
