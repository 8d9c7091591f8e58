# In-flight quotas (`"in_flight": true`): `sluice <name>` takes a slot in
# the access phase and gives it back in the log phase, whichever way the
# request ends. Slow requests are a proxied upstream (a location of this
# same nginx) sending a 60 KB file at 30 KB/s: about 2 s each.
#
# Requests are sent on several connections at once from --- init; what
# they did is read back from the responses and `sluice_metrics`. Nothing
# here asserts how fast nginx is.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);
use SluiceTest ();

our $Quotas = <<'JSON';
{"quotas": [
  {"name": "uploads", "limit": 3, "in_flight": true},
  {"name": "per_client", "limit": 1, "in_flight": true, "per_key": true},
  {"name": "bytes", "limit": 1, "high_burst": 1000000}
]}
JSON

our $Slow = <<'CONF';
location /slow { sluice uploads; proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend/; }
location /backend/ { alias html/; limit_rate 30k; }
location = /metrics { sluice_metrics; }
CONF

add_block_preprocessor(sub {
    my $block = shift;
    SluiceTest::load_sluice_module($block);
    $block->set_value(http_config => "sluice_zone 1m;\nsluice_quotas ../html/quotas.json;\n"
        . "log_format sluice '\$uri \$status \$sluice_status';\n"
        . ($block->http_config // ''));
    $block->set_value(user_files => ">>> quotas.json\n$Quotas>>> big.bin\n" . ('x' x 60000) . "\n"
        . ($block->user_files // ''));
});

worker_connections(256);
no_root_location();
no_shuffle();
run_tests();

sub port { Test::Nginx::Socket::server_port() }

sub connect_to {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => port(), Timeout => 5)
        or die "connect: $!";
    return $s;
}

# Sends GET $path on $n connections at once and reads every response
# whole; returns one {status, sluice} per request, in the order sent.
sub at_once {
    my ($path, $n, $header) = @_;
    my @socks = map { connect_to() } 1 .. $n;
    for my $s (@socks) {
        print $s "GET $path HTTP/1.1\r\nHost: localhost\r\n" . ($header // '')
            . "Connection: close\r\n\r\n";
    }
    my %index = map { ($socks[$_] => $_) } 0 .. $#socks;
    my @raw;
    my $select = IO::Select->new(@socks);
    my $deadline = time + 30;
    while ($select->count && time < $deadline) {
        for my $s ($select->can_read(1)) {
            my $got = sysread($s, my $buf, 65536);
            if ($got) {
                $raw[$index{$s}] .= $buf;
                next;
            }
            $select->remove($s);
            close $s;
        }
    }
    return map {
        my $raw = $raw[$_] // '';
        my ($status) = $raw =~ m{^HTTP/1\.\d (\d{3})};
        my ($sluice) = $raw =~ m{\r\nX-Sluice: (\S+)\r\n}i;
        { status => $status // 0, sluice => $sluice // '' }
    } 0 .. $n - 1;
}

sub metric { SluiceTest::metric_value(port(), '/metrics', $_[0]) }

# Waits (up to 10 s) until the quota's slots are all back.
sub all_back {
    my ($quota) = @_;
    my $deadline = time + 10;
    while (time < $deadline) {
        return 1 if (metric("sluice_in_flight_slots{quota=\"$quota\"}") // -1) == 0;
        sleep 0.1;
    }
    return 0;
}

# Opens $n slow requests and waits until each has its response headers
# (so each holds its slot); returns the sockets, still reading.
sub hold_open {
    my ($path, $n) = @_;
    my @socks = map { connect_to() } 1 .. $n;
    print $_ "GET $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" for @socks;
    for my $s (@socks) {
        my $head = '';
        while ($head !~ /\r\n\r\n/) {
            sysread($s, my $buf, 1) or last;
            $head .= $buf;
        }
        die "no response headers: $head" unless $head =~ m{^HTTP/1\.1 200};
    }
    return @socks;
}

__DATA__

=== TEST 1: 3 slots, 4 concurrent slow requests: one rejected with 429 and REJECTED
--- config eval: $main::Slow . q{ add_header X-Sluice $sluice_status always; }
--- init
my @r = main::at_once('/slow/big.bin', 4);
my @ok = grep { $_->{status} == 200 } @r;
my @rejected = grep { $_->{status} == 429 } @r;
Test::More::is(scalar @ok, 3, '3 passed');
Test::More::is(scalar @rejected, 1, '1 rejected');
Test::More::is($rejected[0]{sluice}, 'REJECTED', '$sluice_status REJECTED') if @rejected;
Test::More::is_deeply([map { $_->{sluice} } @ok], [('PASSED') x 3], 'the others PASSED');
Test::More::ok(main::all_back('uploads'), 'every slot came back after the requests ended');
# And the 3 slots take 3 requests at once again.
my @again = main::at_once('/slow/big.bin', 3);
Test::More::is_deeply([map { $_->{status} } @again], [200, 200, 200], '3 at once pass again');
--- request
GET /metrics
--- response_body_like eval
qr/\nsluice_checks_total\{quota="uploads",result="passed"\} 6\nsluice_checks_total\{quota="uploads",result="rejected"\} 1\n(?s:.*)\nsluice_quota_limit\{quota="uploads",per="at_once",kind="in_flight"\} 3\n/
--- no_error_log
[alert]
[crit]



=== TEST 2: a client that closes mid-response gives its slot back
--- config eval: $main::Slow
--- init
my @held = main::hold_open('/slow/big.bin', 3);
Test::More::is(main::metric('sluice_in_flight_slots{quota="uploads"}'), 3, '3 slots held');
my @r = main::at_once('/slow/big.bin', 1);
Test::More::is($r[0]{status}, 429, 'a fourth is rejected while they hold them');
close $_ for @held;
Test::More::ok(main::all_back('uploads'), 'the closed clients gave their slots back');
my @again = main::at_once('/slow/big.bin', 3);
Test::More::is_deeply([map { $_->{status} } @again], [200, 200, 200], '3 at once pass again');
--- request
GET /metrics
--- response_body_like
sluice_in_flight_slots\{quota="uploads"\} 0
--- no_error_log
[alert]
[crit]



=== TEST 2b: an in-flight rejection is logged as every slot held, not as one that can never pass
--- config eval: $main::Slow
--- init
my @held = main::hold_open('/slow/big.bin', 3);
my @r = main::at_once('/slow/big.bin', 1);
Test::More::is($r[0]{status}, 429, 'a fourth is rejected while they hold them');
close $_ for @held;
Test::More::ok(main::all_back('uploads'), 'the closed clients gave their slots back');
--- request
GET /metrics
--- error_log eval
qr/sluice: limiting requests by quota "uploads" \(limit 3 at once, weight 1\): 3 at once, all held, client:/
--- no_error_log
can never pass



=== TEST 2c: an in-flight quota claims no reset: no RateLimit fields for it (a rate quota has them)
--- config
sluice_headers on;
location /one/ { alias html/; sluice uploads; }
location /rate/ { alias html/; sluice bytes; }
--- request eval
["GET /one/index.html", "GET /rate/index.html"]
--- error_code eval
[200, 200]
--- raw_response_headers_unlike eval
[qr/RateLimit/i, qr/^$/]
--- raw_response_headers_like eval
[qr/^HTTP/, qr/\r\nRateLimit-Policy: "bytes";q=1;w=1\r\n/]



=== TEST 3: an upstream error gives the slot back, and an internal redirect charges once
--- config
location /broken { sluice uploads; proxy_pass http://127.0.0.1:1; }
location /redirected { sluice uploads; proxy_pass http://127.0.0.1:1; error_page 502 = /fallback; }
location /fallback { sluice uploads; return 200 "fallback\n"; }
location = /metrics { sluice_metrics; }
--- request eval
[("GET /broken") x 5, ("GET /redirected") x 5, "GET /metrics"]
--- error_code eval
[(502) x 5, (200) x 5, 200]
--- response_body_like eval
[(qr/502/) x 5, (qr/^fallback$/) x 5,
 qr/\nsluice_checks_total\{quota="uploads",result="passed"\} 10\nsluice_checks_total\{quota="uploads",result="rejected"\} 0\n(?s:.*)\nsluice_in_flight_slots\{quota="uploads"\} 0\n/]



=== TEST 4: dry run: nothing rejected, the one over the limit is REJECTED_DRY_RUN
--- config eval: $main::Slow . q{ sluice_dry_run on; add_header X-Sluice $sluice_status always; }
--- init
my @r = main::at_once('/slow/big.bin', 4);
Test::More::is_deeply([map { $_->{status} } @r], [(200) x 4], 'all 4 served');
my @dry = grep { $_->{sluice} eq 'REJECTED_DRY_RUN' } @r;
Test::More::is(scalar @dry, 1, 'one REJECTED_DRY_RUN');
Test::More::ok(main::all_back('uploads'), 'the 3 slots came back, the dry-run one held none');
--- request
GET /metrics
--- response_body_like
sluice_checks_total\{quota="uploads",result="dry_run_rejected"\} 1



=== TEST 5: sluice_status sets the status, as limit_conn_status does; a per-key quota's slots are each key's
--- config
location /slow { sluice per_client key=$http_x_client; sluice_status 503;
                 proxy_pass http://127.0.0.1:$TEST_NGINX_SERVER_PORT/backend/; }
location /backend/ { alias html/; limit_rate 30k; }
--- init
my @a = main::at_once('/slow/big.bin', 2, "X-Client: alice\r\n");
Test::More::is_deeply([sort map { $_->{status} } @a], [200, 503], "alice's second waits for her first");
my @b = main::at_once('/slow/big.bin', 1, "X-Client: bob\r\n");
Test::More::is($b[0]{status}, 200, 'bob has a slot of his own');
--- request
GET /slow/big.bin
--- more_headers
X-Client: alice
--- error_code: 200



=== TEST 6: a slot and a charge on one request: both log-phase handlers run (the charge first) and every slot comes back
--- http_config
log_format both '$uri $status $sluice_status $sluice_charge_status';
--- config
access_log logs/access.log both;
location /both/ { alias html/; sluice uploads; sluice_charge bytes weight=$bytes_sent; }
location = /metrics { sluice_metrics; }
--- user_files
>>> small.txt
small
--- request eval
[("GET /both/small.txt") x 5, "GET /metrics"]
--- error_code eval
[(200) x 6]
--- response_body_like eval
[(qr/^small$/) x 5,
 qr/\nsluice_checks_total\{quota="uploads",result="passed"\} 5\nsluice_checks_total\{quota="uploads",result="rejected"\} 0\n(?s:.*)\nsluice_quota_level\{quota="bytes"\} [1-9]\d*(?s:.*)\nsluice_in_flight_slots\{quota="uploads"\} 0\n/]
--- access_log
/both/small.txt 200 PASSED CHARGED



=== TEST 6b: a charge of the in-flight quota itself counts nothing (it would hold slots nothing gives back)
--- http_config
log_format both '$uri $status $sluice_status $sluice_charge_status';
--- config
access_log logs/access.log both;
location /self/ { alias html/; sluice uploads; sluice_charge uploads weight=5; }
location = /metrics { sluice_metrics; }
--- user_files
>>> small.txt
small
--- request eval
[("GET /self/small.txt") x 5, "GET /metrics"]
--- error_code eval
[(200) x 6]
--- response_body_like eval
[(qr/^small$/) x 5,
 qr/\nsluice_checks_total\{quota="uploads",result="passed"\} 5\nsluice_checks_total\{quota="uploads",result="rejected"\} 0\n(?s:.*)\nsluice_in_flight_slots\{quota="uploads"\} 0\n/]
--- access_log
/self/small.txt 200 PASSED UNKNOWN
