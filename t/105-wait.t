# `sluice <name> wait=<time>`: pacing by delay. A request over its quota
# whose turn comes within wait= is counted at once and held with an nginx
# timer, then passes (`$sluice_status` DELAYED); one whose turn is further
# away is rejected at once and not counted. A client that closes while it
# is held gives its weight back, and its timer goes with it;
# `sluice_wait_max` caps how many are held at once.
#
# Bursts are sent on many connections at once (`burst` below) from
# --- init; what they did is read back from the responses, the access log
# and `sluice_metrics`. Nothing here asserts how fast nginx is: where a
# time is checked it is a lower bound the pacing itself sets.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);
use SluiceTest ();

our $Quotas = <<'JSON';
{"quotas": [
  {"name": "four", "limit": 4, "low_burst": 4, "high_burst": 4},
  {"name": "slow", "limit": 1, "low_burst": 1, "high_burst": 1},
  {"name": "quick", "limit": 10, "low_burst": 1, "high_burst": 1},
  {"name": "half", "limit": 2, "low_burst": 1, "high_burst": 1},
  {"name": "many", "limit": 10, "low_burst": 1, "high_burst": 1},
  {"name": "hourly", "limit": 0.01, "low_burst": 1, "high_burst": 1},
  {"name": "banded", "limit": 4, "low_burst": 1, "high_burst": 3},
  {"name": "win", "limit": 2, "low_burst": 2, "high_burst": 2, "window": "10s"},
  {"name": "per_key", "limit": 2, "low_burst": 1, "high_burst": 1, "per_key": true}
]}
JSON

add_block_preprocessor(sub {
    my $block = shift;
    SluiceTest::load_sluice_module($block);
    $block->set_value(http_config => "sluice_zone 1m;\nsluice_quotas ../html/quotas.json;\n"
        . "log_format sluice '\$uri \$status \$sluice_status';\n"
        . ($block->http_config // ''))
        unless defined $block->must_die;
    $block->set_value(user_files => ">>> quotas.json\n$Quotas" . ($block->user_files // ''));
});

worker_connections(256);
no_root_location();
no_shuffle();
run_tests();

sub port { Test::Nginx::Socket::server_port() }

# Sends GET $path on $n connections at once; returns one {status, sluice,
# secs} per request (secs: from the first send to the end of its
# response), in the order sent.
sub burst {
    my ($path, $n) = @_;
    my @socks = map {
        IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => port(), Timeout => 5)
            or die "connect: $!";
    } 1 .. $n;
    my $start = time;
    for my $s (@socks) {
        print $s "GET $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    }
    my %index = map { ($socks[$_] => $_) } 0 .. $#socks;
    my (@raw, @done);
    my $select = IO::Select->new(@socks);
    my $deadline = $start + 30;
    while ($select->count && time < $deadline) {
        for my $s ($select->can_read(1)) {
            my $i = $index{$s};
            my $got = sysread($s, my $buf, 65536);
            if ($got) {
                $raw[$i] .= $buf;
                next;
            }
            $done[$i] = time - $start;
            $select->remove($s);
            close $s;
        }
    }
    return map {
        my $raw = $raw[$_] // '';
        my ($status) = $raw =~ m{^HTTP/1\.\d (\d{3})};
        my ($sluice) = $raw =~ m{\r\nX-Sluice: (\S+)\r\n}i;
        { status => $status // 0, sluice => $sluice // '', secs => $done[$_] // 99 }
    } 0 .. $n - 1;
}

# Opens $n connections, sends GET $path on each, and returns the sockets
# without reading (the caller closes them).
sub send_and_keep {
    my ($path, $n) = @_;
    return map {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => port(), Timeout => 5)
            or die "connect: $!";
        print $s "GET $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        $s;
    } 1 .. $n;
}

sub get { SluiceTest::http_request('GET', 'http://127.0.0.1:' . port() . $_[0]) }

# One series of the metrics text, as a number (undef when absent).
sub metric { SluiceTest::metric_value(port(), '/metrics', $_[0]) }

# This nginx's resident memory in KiB (one process: master_process off).
sub rss_kib {
    my $pid = SluiceTest::nginx_pid($ENV{TEST_NGINX_SERVER_ROOT} // Test::Nginx::Socket::server_root());
    open my $fh, '<', "/proc/$pid/status" or die "no /proc/$pid/status: $!";
    while (<$fh>) { return $1 if /^VmRSS:\s+(\d+) kB/ }
    die "no VmRSS for $pid";
}

__DATA__

=== TEST 1: a burst of twice the burst at once: nothing rejected, the rest held to the limit's pace
--- config
access_log logs/access.log sluice;
location / { root html; sluice four wait=3s; add_header X-Sluice $sluice_status always; }
location = /metrics { sluice_metrics; }
--- init
my @r = main::burst('/index.html', 8);
my @statuses = map { $_->{status} } @r;
Test::More::is_deeply(\@statuses, [(200) x 8], 'all 8 passed, none rejected');
my @held = grep { $_->{sluice} eq 'DELAYED' } @r;
my @passed = grep { $_->{sluice} eq 'PASSED' } @r;
Test::More::is(@held + @passed, 8, 'each was PASSED or DELAYED');
# 4 fit the burst; the other 4 take 1/4 s each. A little leaks while the
# burst is sent, so at least 3 must wait.
Test::More::cmp_ok(scalar @held, '>=', 3, 'the requests over the burst were held');
my ($last) = sort { $b <=> $a } map { $_->{secs} } @r;
# 8 units at 4/s from a burst of 4: the last one's turn is ~1 s in.
Test::More::cmp_ok($last, '>=', 0.7, "the last response came at the limit's pace ($last s)");
$main::Held = scalar @held;
--- request
GET /metrics
--- response_body_like eval
[qr/\nsluice_delay_waiting 0\n/]
--- no_error_log
[alert]
[crit]



=== TEST 1b: ...the metrics count each held request once, and what it was given to wait
--- init
my $held = main::metric('sluice_delayed_requests_total{mode="held"}');
Test::More::is($held, $main::Held, 'delayed requests counted as held');
Test::More::is(main::metric('sluice_checks_total{quota="four",result="passed"}'), 8,
    'all 8 counted once in the quota');
my $secs = main::metric('sluice_delay_seconds_total');
# Waits of about 1/4, 1/2, 3/4 and 1 s.
Test::More::cmp_ok($secs, '>', 0.2 * $held, "wait seconds summed ($secs)");
Test::More::cmp_ok($secs, '<=', 0.25 * 10, 'no wait above the pace');
Test::More::is(main::metric('sluice_delay_abandoned_total'), 0, 'none abandoned');
Test::More::is(main::metric('sluice_delay_coalesced_total'), 0,
    'none let go early without sluice_wait_coalesce');
--- request
GET /metrics
--- response_body_like eval
qr/\nsluice_delayed_requests_total\{mode="dry_run"\} 0\n/



=== TEST 2: a request whose turn is further than wait= is rejected at once and not counted
--- config
location / { root html; sluice slow wait=500ms; sluice_headers on; add_header X-Sluice $sluice_status always; }
location = /metrics { sluice_metrics; }
--- request eval
["GET /index.html", "GET /index.html", "GET /metrics"]
--- error_code eval
[200, 429, 200]
--- response_headers eval
["X-Sluice: PASSED", "X-Sluice: REJECTED\nRetry-After: 1", ""]
--- response_body_like eval
[qr/./, qr/429/, qr/(?s)^(?=.*\nsluice_delayed_requests_total\{mode="held"\} 0\n)(?=.*\nsluice_delay_waiting 0\n)(?=.*\nsluice_checks_total\{quota="slow",result="passed"\} 1\nsluice_checks_total\{quota="slow",result="rejected"\} 1\n)(?=.*\nsluice_quota_level\{quota="slow"\} (?:1|0\.\d+)\n)/]



=== TEST 3: $sluice_status is DELAYED in the access log, and the wait is logged at error level
--- config
access_log logs/access.log sluice;
location / { root html; sluice half wait=2s; }
--- request
GET /index.html
--- access_log
/index.html 200 PASSED
--- no_error_log
delaying request



=== TEST 3b: ...for the second request
--- request
GET /index.html
--- access_log
/index.html 200 DELAYED
--- error_log eval
qr/\[error\] .*sluice: delaying request by (?:4\d\d|500)ms for quota "half" \(weight 1, wait=2000ms\), client: 127\.0\.0\.1/



=== TEST 4: sluice_log_level moves the wait's log line too
--- config
location / { root html; sluice half wait=2s; sluice_log_level info; }
--- init
main::get('/index.html');
--- request
GET /index.html
--- error_log eval
qr/\[info\] .*sluice: delaying request by \d+ms for quota "half"/
--- no_error_log
[error]



=== TEST 5: with several checks the longest wait wins, and it is logged with its quota
--- config
access_log logs/access.log sluice;
location / { root html; sluice quick wait=2s; sluice half wait=2s; }
--- init
main::get('/index.html');
my $t = Time::HiRes::time();
my $r = main::get('/index.html');
my $took = Time::HiRes::time() - $t;
Test::More::is($r->{status}, 200, 'the second request passed');
# quick's turn is 0.1 s away, half's 0.5 s: it waits for half.
Test::More::cmp_ok($took, '>=', 0.4, "it waited for the slower quota ($took s)");
--- request
GET /index.html
--- error_code: 200
--- access_log
/index.html 200 DELAYED
--- error_log eval
qr/sluice: delaying request by \d+ms for quota "half"/



=== TEST 6: several checks pass together or count nothing: one over its wait= rejects and nothing is counted
--- config
location /both/ { alias html/; sluice quick wait=2s; sluice slow wait=200ms; }
location /quick/ { alias html/; sluice quick; }
--- request eval
["GET /both/index.html", "GET /both/index.html", "GET /quick/index.html"]
--- error_code eval
[200, 429, 429]



=== TEST 6b: ...the rejection did not count on "quick": after its 0.1 s it has room again
--- config
location /both/ { alias html/; sluice quick wait=2s; sluice slow wait=200ms; }
location /quick/ { alias html/; sluice quick; }
location = /metrics { sluice_metrics; }
--- init
main::get('/both/index.html');
main::get('/both/index.html');
sleep 0.25;
--- request eval
["GET /quick/index.html", "GET /metrics"]
--- error_code eval
[200, 200]
--- response_body_like eval
[qr/./, qr/sluice_checks_total\{quota="quick",result="passed"\} 2\n/]



=== TEST 7: a request held and then internally redirected is charged once
--- config
access_log logs/access.log sluice;
location / { root html; index index.html; sluice half wait=2s; }
location = /metrics { sluice_metrics; }
--- request eval
["GET /", "GET /", "GET /metrics"]
--- error_code eval
[200, 200, 200]
--- response_body_like eval
[qr/./, qr/./, qr/sluice_checks_total\{quota="half",result="passed"\} 2\n/]



=== TEST 8: dry run neither holds nor rejects: DELAYED_DRY_RUN, counted, logged
--- config
access_log logs/access.log sluice;
location / { root html; sluice hourly wait=1h; sluice_dry_run on; }
location = /metrics { sluice_metrics; }
--- init
main::get('/index.html');
--- request
GET /index.html
--- error_code: 200
--- access_log
/index.html 200 DELAYED_DRY_RUN
--- error_log eval
qr/sluice: delaying request, dry run, by \d+ms for quota "hourly" \(weight 1, wait=3600000ms\)/



=== TEST 8b: ...counted in the quota and in the metrics, and nothing held
--- request
GET /metrics
--- response_body_like eval
qr/(?s)^(?=.*\nsluice_delayed_requests_total\{mode="held"\} 0\nsluice_delayed_requests_total\{mode="dry_run"\} 1\n)(?=.*\nsluice_checks_total\{quota="hourly",result="passed"\} 2\n)(?=.*\nsluice_delay_waiting 0\n)/



=== TEST 9: a weight inside the burst band waits for an empty bucket, never for a draw
--- config
location / { root html; sluice banded weight=2 wait=2s; add_header X-Sluice $sluice_status always; }
--- request eval
["GET /index.html", "GET /index.html", "GET /index.html"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["X-Sluice: PASSED", "X-Sluice: DELAYED", "X-Sluice: DELAYED"]



=== TEST 9b: a per-key quota paces each key on its own counter
--- config
location / { root html; sluice per_key key=$arg_k wait=2s; add_header X-Sluice $sluice_status always; }
--- request eval
["GET /index.html?k=a", "GET /index.html?k=a", "GET /index.html?k=b", "GET /index.html"]
--- error_code eval
[200, 200, 200, 200]
--- response_headers eval
["X-Sluice: PASSED", "X-Sluice: DELAYED", "X-Sluice: PASSED", "X-Sluice: NO_KEY"]



=== TEST 9c: holds on one keep-alive connection, one after the other
--- config
location / { root html; sluice half wait=2s; add_header X-Sluice $sluice_status always; }
--- pipelined_requests eval
["GET /index.html", "GET /index.html", "GET /index.html"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["X-Sluice: PASSED", "X-Sluice: DELAYED", "X-Sluice: DELAYED"]



=== TEST 10: a full window quota is not taken in advance: rejected with its Retry-After
--- config
location / { root html; sluice win wait=1h; sluice_headers on; }
--- request eval
["GET /index.html", "GET /index.html", "GET /index.html"]
--- error_code eval
[200, 200, 429]
--- response_headers_like eval
["", "", "Retry-After: (?:10|[1-9])"]



=== TEST 11: clients that close while held: counted once, timers removed, nothing left waiting
--- config
access_log logs/access.log sluice;
location / { root html; sluice many wait=1h; }
location = /metrics { sluice_metrics; }
--- init
main::get('/index.html');
# 30 requests: turns 0.1 s apart, the last 3 s away. Close them as soon as
# all are held (a few early ones may be served first).
my @socks = main::send_and_keep('/index.html', 30);
my $held = SluiceTest::wait_until(sub {
    (main::metric('sluice_delayed_requests_total{mode="held"}') // 0) >= 30
}, 10);
Test::More::ok($held, 'all 30 were held');
close $_ for @socks;
my $settled = SluiceTest::wait_until(sub { main::metric('sluice_delay_waiting') == 0 }, 5);
Test::More::ok($settled, 'nothing is waiting once the clients left');
my $abandoned = main::metric('sluice_delay_abandoned_total');
Test::More::cmp_ok($abandoned, '>=', 20, "most left before their turn ($abandoned)");
Test::More::cmp_ok($abandoned, '<=', 30, 'no hold ended twice');
Test::More::is(main::metric('sluice_checks_total{quota="many",result="passed"}'), 31,
    'each request counted once, whether it left or not');
# Past every timer the closed requests had: nothing fires on a freed
# request, and nginx still serves.
sleep 3.2;
Test::More::is(main::metric('sluice_delay_abandoned_total'), $abandoned,
    'no abandoned hold is counted again later');
--- request
GET /metrics
--- response_body_like eval
qr/\nsluice_delay_waiting 0\n/
--- access_log eval
qr/\/index\.html 499 DELAYED/
--- no_error_log
[alert]
[crit]
[emerg]



=== TEST 11b: holds abandoned by their clients give their weight back: the quota is free again at once
30 requests are held for a 1/s quota (turns up to 30 s away), then their
clients leave. Counting locally (no root), the next fold takes the 30 units
back out of the level, so a plain check a second later passes where it
would have been rejected for half a minute.
--- config
location / { root html; sluice slow wait=1h; }
location /plain/ { alias html/; sluice slow; }
location = /metrics { sluice_metrics; }
--- init
main::get('/index.html');
my @socks = main::send_and_keep('/index.html', 30);
my $held = SluiceTest::wait_until(sub {
    (main::metric('sluice_delayed_requests_total{mode="held"}') // 0) >= 30
}, 10);
Test::More::ok($held, 'all 30 were held');
close $_ for @socks;
my $settled = SluiceTest::wait_until(sub { main::metric('sluice_delay_waiting') == 0 }, 5);
Test::More::ok($settled, 'nothing is waiting once the clients left');
my $returned = main::metric('sluice_delay_returned_units_total');
Test::More::cmp_ok($returned, '>=', 29, "their units came back ($returned)");
sleep 1.2;
--- request
GET /plain/index.html
--- error_code: 200
--- no_error_log
[alert]
[crit]



=== TEST 11c: sluice_wait_max holds at most that many at once; the rest are rejected at once with Retry-After
--- config
location / {
    root html;
    sluice many wait=10s;
    sluice_wait_max 5;
    sluice_headers on;
    add_header X-Sluice $sluice_status always;
}
location = /metrics { sluice_metrics; }
--- init
main::get('/index.html');
# Ten more at once: turns 0.1 s apart. Five are held, five refused.
my @r = main::burst('/index.html', 10);
my @refused = grep { $_->{status} == 429 } @r;
my @held = grep { $_->{status} == 200 && $_->{sluice} eq 'DELAYED' } @r;
Test::More::is(scalar @refused, 5, 'five refused at once');
Test::More::is(scalar @held, 5, 'five held, and served at their turn');
Test::More::ok((grep { $_->{sluice} eq 'REJECTED' } @refused) == 5, 'refused ones say REJECTED');
Test::More::is(main::metric('sluice_delay_refused_total'), 5, 'and are counted');
Test::More::is(main::metric('sluice_delay_returned_units_total'), 0,
    'a refused hold was never counted in a quota (its unit came straight back)');
# With the holds ended, the cap is free again.
my @again = main::burst('/index.html', 3);
Test::More::ok((grep { $_->{status} == 200 } @again) == 3, 'the cap frees as holds end');
--- request
GET /metrics
--- response_body_like eval
qr/\nsluice_delay_waiting 0\n/



=== TEST 11d: a bad sluice_wait_max is refused with file:line
--- config
location / { sluice many wait=1s; sluice_wait_max lots; }
--- must_die
--- error_log eval
qr/invalid value "lots": must be a number of requests from 0 to 1000000 in .*nginx\.conf:\d+/



=== TEST 12: many clients closing while held: memory and timers stay flat
--- config
location / { root html; sluice slow wait=1h; }
location = /metrics { sluice_metrics; }
--- init
my $total = 0;
my $round = sub {
    my @socks = main::send_and_keep('/index.html', 50);
    $total += 50;
    SluiceTest::wait_until(sub {
        (main::metric('sluice_delayed_requests_total{mode="held"}') // 0) >= $total - 1
    }, 10) or die "round not held";
    close $_ for @socks;
    SluiceTest::wait_until(sub { main::metric('sluice_delay_waiting') == 0 }, 5)
        or die "holds left waiting";
};
$round->() for 1 .. 3;
my $before = main::rss_kib();
$round->() for 1 .. 12;
my $after = main::rss_kib();
Test::More::cmp_ok($after - $before, '<', 1024,
    "600 abandoned holds: resident memory $before -> $after KiB");
Test::More::cmp_ok(main::metric('sluice_delay_abandoned_total'), '>=', $total - 1,
    "every closed hold was cleaned up ($total)");
--- request
GET /metrics
--- response_body_like eval
qr/\nsluice_delay_waiting 0\n/
--- no_error_log
[alert]
[crit]



=== TEST 13: wait=0 is a plain check
--- config
location / { root html; sluice slow wait=0; add_header X-Sluice $sluice_status always; }
--- request eval
["GET /index.html", "GET /index.html"]
--- error_code eval
[200, 429]



=== TEST 14: a negative wait= is refused with file:line
--- config
location / { sluice a wait=-1s; }
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid value "wait=-1s": wait= must not be negative in .*nginx\.conf:\d+/



=== TEST 15: an unparsable wait= is refused with file:line
--- config
location / { sluice a wait=soon; }
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid value "wait=soon": wait= must be a time such as 500ms, 1s or 2m in .*nginx\.conf:\d+/



=== TEST 16: a wait= over an hour is refused with file:line
--- config
location / { sluice a wait=61m; }
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid value "wait=61m": wait= must be at most 1h in .*nginx\.conf:\d+/



=== TEST 17: a duplicate wait= is refused like other duplicate parameters
--- config
location / { sluice a wait=1s wait=2s; }
--- must_die
--- error_log eval
qr/\[emerg\] .*duplicate parameter "wait=2s" in .*nginx\.conf:\d+/



=== TEST 18: every parameter together is accepted
--- config
location / { root html; sluice no_such$arg_none key=$arg_k no_key=pass weight=$arg_w empty=0 wait=1s; add_header X-Sluice $sluice_status always; }
--- request
GET /index.html?k=a&w=1
--- response_headers
X-Sluice: UNKNOWN



=== TEST 19: one parameter more is nginx's own error
--- config
location / { sluice a key=$arg_k no_key=pass weight=$arg_w empty=0 wait=1s wait=1s; }
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid number of arguments in "sluice" directive in .*nginx\.conf:\d+/



=== TEST 20: sluice_wait_coalesce lets a hold end early on a wakeup the worker has anyway
--- config
access_log logs/access.log sluice;
location / { root html; sluice slow wait=3s; sluice_wait_coalesce 1s; }
location = /poke { root html; try_files /index.html =404; }
location = /metrics { sluice_metrics; }
--- init
# "slow": 1/s from a burst of 1. Three at once: the first passes, the
# second's turn is 1 s away (within the 1 s window: not held at all), the
# third's 2 s away (it may go from 1 s on). A request to another location
# at about 1.5 s wakes the worker: the third goes then, before its turn.
my @socks = main::send_and_keep('/index.html', 3);
sleep 1.5;
Test::More::is(main::get('/poke')->{status}, 200, 'the poke was served');
my @status;
for my $s (@socks) {
    my $select = IO::Select->new($s);
    my $raw = '';
    while ($select->can_read(5)) {
        my $got = sysread($s, my $buf, 65536);
        last unless $got;
        $raw .= $buf;
    }
    close $s;
    push @status, $raw =~ m{^HTTP/1\.\d (\d{3})} ? $1 : 0;
}
Test::More::is_deeply(\@status, [200, 200, 200], 'all three passed');
Test::More::is(main::metric('sluice_delayed_requests_total{mode="held"}'), 2,
    'two were over the quota and paced');
Test::More::is(main::metric('sluice_delay_coalesced_total'), 2,
    'both went before their turn: one at once, one on the poke');
Test::More::is(main::metric('sluice_checks_total{quota="slow",result="passed"}'), 3,
    'each counted once');
--- request
GET /metrics
--- response_body_like eval
qr/\nsluice_delay_waiting 0\n/
--- access_log eval
qr/\/index\.html 200 DELAYED/
--- no_error_log
[alert]
[crit]



=== TEST 20b: a hold's own timer lets go the holds due within the window
--- config
location / { root html; sluice half wait=3s; sluice_wait_coalesce 600ms; }
location = /metrics { sluice_metrics; }
--- init
# "half": 2/s from a burst of 1. Of 4 at once, one passes and three are
# paced 0.5 s apart: the first of them (0.5 s) is within the window and
# goes at once; nothing wakes the worker until the 1 s one's timer, which
# lets the 1.5 s one (free to go from 0.9 s) go with it.
my @r = main::burst('/index.html', 4);
Test::More::is_deeply([map { $_->{status} } @r], [(200) x 4], 'all 4 passed');
my ($last) = sort { $b <=> $a } map { $_->{secs} } @r;
Test::More::cmp_ok($last, '>=', 0.85, "the last still waited for its window ($last s)");
Test::More::is(main::metric('sluice_delay_coalesced_total'), 2, 'two let go early');
Test::More::is(main::metric('sluice_delayed_requests_total{mode="held"}'), 3, 'three paced');
--- request
GET /metrics
--- response_body_like eval
qr/\nsluice_delay_waiting 0\n/
--- no_error_log
[alert]
[crit]



=== TEST 20c: clients that close while held in the coalescing list leave nothing behind
--- config
location / { root html; sluice many wait=1h; sluice_wait_coalesce 50ms; }
location = /poke { root html; try_files /index.html =404; }
location = /metrics { sluice_metrics; }
--- init
main::get('/index.html');
# 30 paced 0.1 s apart (the last 3 s away), closed once all are held.
my @socks = main::send_and_keep('/index.html', 30);
SluiceTest::wait_until(sub {
    (main::metric('sluice_delayed_requests_total{mode="held"}') // 0) >= 30
}, 10) or die "not all held";
close $_ for @socks;
Test::More::ok(SluiceTest::wait_until(sub { main::metric('sluice_delay_waiting') == 0 }, 5),
    'nothing is waiting once the clients left');
# Past every turn they had: requests keep waking the worker, and nothing
# it lets go belongs to a freed request.
for (1 .. 16) {
    main::get('/poke');
    sleep 0.2;
}
Test::More::is(main::get('/poke')->{status}, 200, 'nginx still serves');
my $abandoned = main::metric('sluice_delay_abandoned_total');
my $coalesced = main::metric('sluice_delay_coalesced_total');
Test::More::cmp_ok($abandoned + $coalesced, '>=', 20, "most left before their turn ($abandoned)");
--- request
GET /metrics
--- response_body_like eval
qr/\nsluice_delay_waiting 0\n/
--- no_error_log
[alert]
[crit]
[emerg]



=== TEST 21: a negative sluice_wait_coalesce is refused with file:line
--- config
sluice_wait_coalesce -5ms;
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid value "-5ms": must not be negative in .*nginx\.conf:\d+/



=== TEST 22: a sluice_wait_coalesce over a second is refused with file:line
--- config
location / { sluice_wait_coalesce 2s; }
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid value "2s": must be at most 1s in .*nginx\.conf:\d+/



=== TEST 23: an unparsable sluice_wait_coalesce is refused with file:line
--- config
location / { sluice_wait_coalesce soon; }
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid value "soon": must be a time such as 5ms or 20ms in .*nginx\.conf:\d+/



=== TEST 24: sluice_wait_coalesce twice at one level is refused
--- config
location / { sluice_wait_coalesce 5ms; sluice_wait_coalesce 10ms; }
--- must_die
--- error_log eval
qr/\[emerg\] .*"sluice_wait_coalesce" directive is duplicate in .*nginx\.conf:\d+/
