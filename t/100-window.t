# Window quotas through nginx (standalone, a local quota file): a fixed 1 s
# window starts over at the UTC second; a sliding one carries the previous
# window's weighted share, per key too; a ladder (1 s under 10 s) is
# checked all, then committed; a rejection is logged with the limit in its
# own terms (`2 / min sliding`, not a rate per second); bad window
# settings fail `nginx -t` with file:line.
#
# Windows are UTC-aligned, so the blocks that count across windows wait
# for a boundary (`at_fraction`) and check, from the client's clock, that
# their requests landed where they meant; a run that did not (a loaded
# machine) is tried again in a later window. The standalone sync thread
# folds just after each boundary, so a new window starts empty.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use POSIX qw(floor);
use Time::HiRes qw(time sleep);
use SluiceTest ();

our $Quotas = <<'JSON';
{"quotas": [
  {"name": "per_sec", "limit": 3, "low_burst": 3, "high_burst": 3, "window": "1s"},
  {"name": "fixed4", "limit": 4, "low_burst": 4, "high_burst": 4, "window": "1s"},
  {"name": "sliding4", "limit": 4, "low_burst": 4, "high_burst": 4, "window": "1s",
   "sliding": true},
  {"name": "ten_s", "limit": 5, "low_burst": 5, "high_burst": 5, "window": "10s"},
  {"name": "one_s", "parent": "ten_s", "limit": 2, "low_burst": 2, "high_burst": 2,
   "window": "1s"},
  {"name": "sliding_key", "limit": 4, "low_burst": 4, "high_burst": 4, "window": "1s",
   "sliding": true, "per_key": true}
]}
JSON

add_block_preprocessor(sub {
    my $block = shift;
    SluiceTest::load_sluice_module($block);
    $block->set_value(http_config => "sluice_zone 1m;\nsluice_quotas ../html/quotas.json;\n"
        . "sluice_sync_interval 100ms;\n"
        . ($block->http_config // ''))
        unless defined $block->must_die;
    $block->set_value(user_files => ">>> quotas.json\n$Quotas" . ($block->user_files // ''))
        unless defined $block->user_files;
});

no_root_location();
no_shuffle();
run_tests();

sub port { Test::Nginx::Socket::server_port() }

sub status {
    SluiceTest::http_request('GET', 'http://127.0.0.1:' . port() . $_[0])->{status};
}

sub metrics {
    SluiceTest::http_request('GET', 'http://127.0.0.1:' . port() . '/metrics')->{content};
}

# Sleeps until $fraction of the way into the next window of $len seconds
# (UTC); returns that window's index.
sub at_fraction {
    my ($len, $fraction) = @_;
    my $now = time;
    my $index = floor($now / $len) + 1;
    sleep($index * $len + $fraction * $len - $now);
    return $index;
}

# Where `time` is in its window of $len seconds: (index, fraction).
sub where {
    my ($len) = @_;
    my $now = time;
    return (floor($now / $len), $now / $len - floor($now / $len));
}

# Runs $try (which returns true when its requests landed where it meant)
# up to 5 times; returns what the last run returned.
sub retried {
    my ($try) = @_;
    for (1 .. 5) {
        my @r = $try->();
        return @r if $r[0];
    }
    return (0);
}

__DATA__

=== TEST 1: a fixed 1 s window admits its limit, then starts over at the next second
--- config
location / { root html; sluice per_sec; }
location /free/ { alias html/; }
--- init
my ($landed, $first, $second) = main::retried(sub {
    my $w = main::at_fraction(1, 0.05);
    my @first = map { main::status('/index.html') } 1 .. 4;
    my ($i1) = main::where(1);
    # Past the boundary and the sync thread's fold just after it.
    main::at_fraction(1, 0.2);
    my @second = map { main::status('/index.html') } 1 .. 4;
    my ($i2) = main::where(1);
    return ($i1 == $w && $i2 == $w + 1, \@first, \@second);
});
Test::More::ok($landed, 'the requests landed in two neighbouring seconds');
Test::More::is_deeply($first, [200, 200, 200, 429], 'the first second: 3, then rejected');
Test::More::is_deeply($second, [200, 200, 200, 429], 'the next second starts over');
--- request
GET /free/index.html
--- no_error_log
[alert]
[crit]



=== TEST 2: a sliding window carries the previous window's weighted share
--- config
location /slide/ { alias html/; sluice sliding4; }
location /fixed/ { alias html/; sluice fixed4; }
--- init
my ($landed, $fill, $early, $later) = main::retried(sub {
    my $w = main::at_fraction(1, 0.05);
    my @fill = map { (main::status('/slide/index.html'), main::status('/fixed/index.html')) } 1 .. 4;
    push @fill, main::status('/slide/index.html');
    my ($i0) = main::where(1);
    # 0.1 into the next window 0.9 of the 4 still count: 3.6 + 1 > 4. The
    # fixed window has started over.
    main::at_fraction(1, 0.1);
    my @early = (main::status('/slide/index.html'), main::status('/fixed/index.html'));
    my ($i1, $f1) = main::where(1);
    # 0.6 in, 0.4 of them count (1.6): two more fit, not three.
    sleep(0.6 - $f1) if $f1 < 0.6;
    my ($i2a, $f2a) = main::where(1);
    my @later = map { main::status('/slide/index.html') } 1 .. 3;
    my ($i2, $f2) = main::where(1);
    my $ok = $i0 == $w && $i1 == $w + 1 && $f1 < 0.2
        && $i2a == $w + 1 && $i2 == $w + 1 && $f2a >= 0.52 && $f2 < 0.73;
    return ($ok, \@fill, \@early, \@later);
});
Test::More::ok($landed, 'the requests landed where they were meant to');
Test::More::is_deeply($fill, [(200) x 8, 429], 'both windows admit 4 in the first second');
Test::More::is_deeply($early, [429, 200],
    'early in the next second the sliding window is still full; the fixed one is not');
Test::More::is_deeply($later, [200, 200, 429],
    'later the previous share has shrunk: two more fit');
--- request
GET /fixed/index.html
--- no_error_log
[alert]



=== TEST 3: a ladder (1 s under 10 s) is checked all, then committed
--- config
location / { root html; sluice one_s; }
location = /metrics { sluice_metrics; }
--- init
my ($landed, $s1, $s2, $s3, $level) = main::retried(sub {
    # Three seconds inside one 10 s window.
    my ($i10, $f10) = main::where(10);
    main::at_fraction(10, 0.01) if $f10 > 0.6;
    my ($w10) = main::where(10);
    my $s = main::at_fraction(1, 0.05);
    my @s1 = map { main::status('/index.html') } 1 .. 3;
    my ($i1) = main::where(1);
    main::at_fraction(1, 0.1);
    my @s2 = map { main::status('/index.html') } 1 .. 3;
    my ($i2) = main::where(1);
    main::at_fraction(1, 0.1);
    my @s3 = map { main::status('/index.html') } 1 .. 2;
    # The second was refused by ten_s: one_s must not have counted it.
    my ($level) = main::metrics() =~ /^sluice_quota_level\{quota="one_s"\} (\S+)$/m;
    my ($i3) = main::where(1);
    my ($e10) = main::where(10);
    my $ok = $i1 == $s && $i2 == $s + 1 && $i3 == $s + 2 && $e10 == $w10;
    return ($ok, \@s1, \@s2, \@s3, $level);
});
Test::More::ok($landed, 'three seconds inside one 10 s window');
Test::More::is_deeply($s1, [200, 200, 429], 'second 1: the 1 s rung stops the third');
Test::More::is_deeply($s2, [200, 200, 429], 'second 2: again (4 of the 10 s rung)');
Test::More::is_deeply($s3, [200, 429], 'second 3: the 10 s rung stops the second');
Test::More::is($level, 1, 'a rejection by the 10 s rung counted nothing on the 1 s rung');
--- request
GET /metrics
--- error_code: 200
--- error_log eval
qr/sluice: limiting requests by quota "ten_s", an ancestor of "one_s" \(limit 5 \/ 10s window, weight 1\)/



=== TEST 4: an unknown window name fails nginx -t with file:line
--- http_config
sluice_quotas ../html/quotas.json;
--- config
--- user_files
>>> quotas.json
{"quotas": [{"name": "q", "limit": 5, "low_burst": 5, "high_burst": 5, "window": "2s"}]}
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid quota file ".*quotas\.json": .*2s.* in .*nginx\.conf:\d+/



=== TEST 5: a window quota whose high_burst is above its limit fails nginx -t with file:line
--- http_config
sluice_quotas ../html/quotas.json;
--- config
--- user_files
>>> quotas.json
{"quotas": [{"name": "q", "limit": 5, "low_burst": 5, "high_burst": 8, "window": "1m"}]}
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid quota file ".*quotas\.json": .*high_burst.*8 is above the limit 5.* in .*nginx\.conf:\d+/



=== TEST 6: sliding without a window fails nginx -t with file:line
--- http_config
sluice_quotas ../html/quotas.json;
--- config
--- user_files
>>> quotas.json
{"quotas": [{"name": "q", "limit": 5, "low_burst": 5, "high_burst": 5, "sliding": true}]}
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid quota file ".*quotas\.json": .*sliding.*needs a window.* in .*nginx\.conf:\d+/



=== TEST 7: a sliding per-key quota weighs each key's own previous window
--- config
location /key/ { alias html/; sluice sliding_key key=$arg_t; }
--- init
my $key = sub { main::status("/key/index.html?t=$_[0]") };
my ($landed, $fill, $early, $later) = main::retried(sub {
    my $w = main::at_fraction(1, 0.05);
    my @fill = ((map { $key->('alice') } 1 .. 5), (map { $key->('bob') } 1 .. 4));
    my ($i0) = main::where(1);
    # 0.1 into the next window 0.9 of alice's 4 and of bob's still count:
    # 3.6 + 1 > 4; carol has no previous window.
    main::at_fraction(1, 0.1);
    my @early = ($key->('alice'), $key->('bob'), $key->('carol'));
    my ($i1, $f1) = main::where(1);
    # 0.6 in, 0.4 of alice's count (1.6): two more fit, not three.
    sleep(0.6 - $f1) if $f1 < 0.6;
    my ($i2a, $f2a) = main::where(1);
    my @later = map { $key->('alice') } 1 .. 3;
    my ($i2, $f2) = main::where(1);
    my $ok = $i0 == $w && $i1 == $w + 1 && $f1 < 0.2
        && $i2a == $w + 1 && $i2 == $w + 1 && $f2a >= 0.52 && $f2 < 0.73;
    return ($ok, \@fill, \@early, \@later);
});
Test::More::ok($landed, 'the requests landed where they were meant to');
Test::More::is_deeply($fill, [(200) x 4, 429, (200) x 4],
    'each key admits 4 in the first second, on its own counter');
Test::More::is_deeply($early, [429, 429, 200],
    "early in the next second each key's previous 4 still fill it; a new key is empty");
Test::More::is_deeply($later, [200, 200, 429],
    "later alice's previous share has shrunk: two more fit");
--- request
GET /key/index.html?t=dave
--- no_error_log
[alert]



=== TEST 8: every window name loads
--- config
location / { root html; sluice m; }
location /y/ { alias html/; sluice y; }
location /ew/ { alias html/; sluice ew; }
--- user_files
>>> quotas.json
{"quotas": [
  {"name": "s", "limit": 5, "low_burst": 5, "high_burst": 5, "window": "1s"},
  {"name": "ts", "limit": 5, "low_burst": 5, "high_burst": 5, "window": "10s"},
  {"name": "mi", "limit": 5, "low_burst": 5, "high_burst": 5, "window": "1m", "sliding": true},
  {"name": "h", "limit": 5, "low_burst": 5, "high_burst": 5, "window": "1h"},
  {"name": "d", "limit": 5, "low_burst": 5, "high_burst": 5, "window": "1d"},
  {"name": "w", "limit": 5, "low_burst": 5, "high_burst": 5, "window": "7d"},
  {"name": "m", "limit": 1, "low_burst": 1, "high_burst": 1, "window": "month"},
  {"name": "ew", "limit": 1, "window": "epoch_week", "sliding": true},
  {"name": "td", "limit": 5, "window": "30d"},
  {"name": "y", "limit": 1, "window": "365d"}
]}
--- request eval
["GET /index.html", "GET /index.html", "GET /y/index.html", "GET /y/index.html",
 "GET /ew/index.html", "GET /ew/index.html"]
--- error_code eval
[200, 429, 200, 429, 200, 429]



=== TEST 9: a window quota's rejection is logged with its limit per window, not per second
--- config
location /plan/ { alias html/; sluice plan_minute; }
location /token/ { alias html/; sluice token_day key=$arg_t; }
location /free/ { alias html/; }
--- user_files
>>> quotas.json
{"quotas": [
  {"name": "plan_minute", "limit": 2, "window": "1m", "sliding": true},
  {"name": "token_day", "limit": 1, "window": "1d", "per_key": true}
]}
--- init
# A sliding window still holds the two at a minute's boundary: the third
# is rejected wherever it lands.
my @plan = map { main::status('/plan/index.html') } 1 .. 3;
Test::More::is_deeply(\@plan, [200, 200, 429], 'two a minute, then rejected');
# Three requests: a day's boundary can fall between two of them at most.
my @token = map { main::status('/token/index.html?t=alice') } 1 .. 3;
Test::More::ok($token[0] == 200 && grep({ $_ == 429 } @token[1, 2]),
    "one a day for the key, then rejected (@token)");
--- request
GET /free/index.html
--- error_log eval
[qr/sluice: limiting requests by quota "plan_minute" \(limit 2 \/ min sliding, weight 1\), client:/,
 qr/sluice: limiting requests by quota "token_day" key [0-9a-f]{16} \(limit 1 \/ day per key, weight 1\), client:/]
--- no_error_log eval
qr/limit \d+\/s/
