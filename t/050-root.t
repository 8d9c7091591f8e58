# nginx synced with a real `sluice root` (SQLite, on a loopback port,
# started by this file): quotas created at the root start limiting,
# deleted ones stop, other limiters' weight counts here, seeds from a
# quota file give way to the root's quotas, the sync token is sent, and
# with every root down requests keep passing and the log says so once.
#
# nginx syncs every 200 ms and the roots reread their database every
# 100 ms; a change is given 1.5 s (several intervals) to arrive, so a slow
# CI machine does not make the file flaky.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use File::Temp ();
use HTTP::Tiny;
use JSON::PP ();
use SluiceTest qw(start_root stop_root root_call free_port);

our $Root = start_root();
our $TokenDir = File::Temp::tempdir(CLEANUP => 1);
{
    open my $fh, '>', "$TokenDir/token" or die $!;
    print $fh "s3cret-sync-token\n";
    close $fh;
}
our $GuardedRoot = start_root(args => ['--sync-token-file', "$TokenDir/token"]);

# A test CA and a certificate for localhost, for an https root: nginx
# itself terminates TLS in front of the root, and its sync thread trusts
# the CA through SSL_CERT_FILE (read by the rustls client).
{
    my $d = $TokenDir;
    system("openssl req -x509 -newkey rsa:2048 -nodes -keyout $d/ca.key -out $d/ca.pem "
        . "-days 2 -subj /CN=sluice-test-ca 2>/dev/null") == 0 or die 'openssl: CA';
    system("openssl req -newkey rsa:2048 -nodes -keyout $d/srv.key -out $d/srv.csr "
        . "-subj /CN=localhost 2>/dev/null") == 0 or die 'openssl: request';
    open my $ext, '>', "$d/ext.cnf" or die $!;
    print $ext "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n";
    close $ext;
    system("openssl x509 -req -in $d/srv.csr -CA $d/ca.pem -CAkey $d/ca.key -CAcreateserial "
        . "-out $d/srv.pem -days 2 -extfile $d/ext.cnf 2>/dev/null") == 0 or die 'openssl: sign';
}
$ENV{TEST_NGINX_CA_FILE} = "$TokenDir/ca.pem";
$ENV{TEST_NGINX_CERT} = "$TokenDir/srv.pem";
$ENV{TEST_NGINX_CERT_KEY} = "$TokenDir/srv.key";
$ENV{TEST_NGINX_TLS_PORT} = free_port();
END { stop_root($Root); stop_root($GuardedRoot) }

$ENV{TEST_NGINX_ROOT_URL} = $Root->{url};
$ENV{TEST_NGINX_GUARDED_ROOT_URL} = $GuardedRoot->{url};
$ENV{TEST_NGINX_TOKEN_FILE} = "$TokenDir/token";
$ENV{TEST_NGINX_DEAD_ROOTS} = join ' ', map { "http://127.0.0.1:" . free_port() } 1 .. 2;

add_block_preprocessor(\&SluiceTest::load_sluice_module);

no_shuffle();
no_root_location();
run_tests();

# Creates or changes a quota at a root; fails the test on an error.
sub put_quota {
    my ($root, $name, $body) = @_;
    my ($status, $reply) = root_call($root, 'PUT', "/v1/quotas/$name", $body);
    Test::More::ok($status >= 200 && $status < 300, "root accepted quota $name ($status)")
        or Test::More::diag(JSON::PP->new->allow_nonref->encode($reply));
}

# Sends weight to the root as another limiter would (the sync protocol).
sub other_limiter_sends {
    my ($root, $name, $delta) = @_;
    my ($status, $quota) = root_call($root, 'GET', "/v1/quotas/$name");
    die "no quota $name at the root ($status)" unless $status == 200;
    my ($sync) = root_call($root, 'POST', '/v1/sync',
        { limiter => 'another-host', deltas => [{ id => $quota->{id}, delta => $delta }] });
    Test::More::is($sync, 200, "the other limiter's sync was accepted");
}

# A quota's level at a root (-1 when the root does not answer for it).
sub root_level {
    my ($root, $name) = @_;
    my ($status, $quota) = root_call($root, 'GET', "/v1/quotas/$name");
    return $status == 200 ? $quota->{level} // 0 : -1;
}

__DATA__

=== TEST 1: a quota created at the root starts limiting
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
sluice_host_id t-nginx;
--- config
location /q/ { alias html/; sluice made_at_root; }
location / { root html; }
--- init
main::put_quota($main::Root, 'made_at_root', { limit => 0, low_burst => 2, high_burst => 2 });
sleep 1.5;
--- request eval
["GET /q/index.html", "GET /q/index.html", "GET /q/index.html"]
--- error_code eval
[200, 200, 429]



=== TEST 2: the root knows this limiter and the weight it sent
--- init
sleep 0.5;
my ($status, $quota) = SluiceTest::root_call($main::Root, 'GET', '/v1/quotas/made_at_root');
Test::More::is($status, 200, 'the quota is at the root');
Test::More::cmp_ok($quota->{level}, '>=', 2, 'the root counted the two admitted requests');
Test::More::ok((grep { $_->{limiter} eq 't-nginx' } @{ $quota->{limiters} // [] }),
    'the root lists this nginx as a limiter of the quota');
--- request
GET /index.html



=== TEST 3: a deleted quota stops limiting
--- init
my ($status) = SluiceTest::root_call($main::Root, 'DELETE', '/v1/quotas/made_at_root');
Test::More::ok($status >= 200 && $status < 300, "root deleted the quota ($status)");
sleep 1.5;
--- request eval
["GET /q/index.html", "GET /q/index.html", "GET /q/index.html"]
--- error_code eval
[200, 200, 200]



=== TEST 4: weight admitted by another limiter counts here
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
--- config
location /f/ { alias html/; sluice fleet; }
--- init
# Room for 10 and a half: the estimate may keep a trace (~1e-9) of the
# fill rate measured from the other limiter's jump.
main::put_quota($main::Root, 'fleet', { limit => 0, low_burst => 10.5, high_burst => 10.5 });
sleep 1;
main::other_limiter_sends($main::Root, 'fleet', 5);
# Long enough for the fill rate measured from that jump to die down.
sleep 2;
--- request eval
[("GET /f/index.html") x 8]
--- error_code eval
[200, 200, 200, 200, 200, 429, 429, 429]



=== TEST 4b: holds abandoned by their clients give their weight back at the root
A 10/s quota at the root; 40 requests are held (turns up to 4 s away),
then their clients leave. nginx sends their units to the root as a
return with its next sync: within 2 s the root's level falls from about
41 to a few units (drained at 10/s alone, it would still be above 20),
and a plain check passes half a second later.
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
--- config
location /w/ { alias html/; sluice held_back wait=1h; }
location /p/ { alias html/; sluice held_back; }
--- init
main::put_quota($main::Root, 'held_back', { limit => 10, low_burst => 1, high_burst => 1 });
sleep 1.5;
my $port = Test::Nginx::Socket::server_port();
my $level = sub { main::root_level($main::Root, 'held_back') };
SluiceTest::http_request('GET', "http://127.0.0.1:$port/p/index.html");
my @socks = SluiceTest::send_and_keep($port, '/w/index.html', 40);
Test::More::ok(SluiceTest::wait_until(sub { $level->() >= 30 }, 2),
    'the held requests reached the root (level ' . $level->() . ')');
close $_ for @socks;
Test::More::ok(SluiceTest::wait_until(sub { $level->() <= 3 }, 2),
    'their return reached it too (level ' . $level->() . ')');
# What is left (the first request's unit, a hold or two not yet returned)
# drains in a few tenths of a second.
sleep 0.5;
--- request
GET /p/index.html
--- error_code: 200
--- no_error_log
[alert]
[crit]



=== TEST 4c: holds the root could not keep, given back, are not read as other hosts' traffic
A 1/s quota at the root (burst 1, so the root keeps its level at most at
7); 60 requests are held (turns up to a minute away), then their clients
leave. The root kept 7 of the 60 and stops their return at 0. nginx must
not read the 53 it could not take back as other hosts' fill: its
estimate stays at the root's 0 over the next 2 s (it rose to 10.8 when
it did), and a held request that follows is served without a wait.
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
--- config
location /w/ { alias html/; sluice paced_back wait=1h; add_header X-Sluice $sluice_status always; }
location = /metrics { sluice_metrics; }
--- init
main::put_quota($main::Root, 'paced_back', { limit => 1, low_burst => 1, high_burst => 1 });
sleep 1.5;
my $port = Test::Nginx::Socket::server_port();
my $level = sub { main::root_level($main::Root, 'paced_back') };
my @socks = SluiceTest::send_and_keep($port, '/w/index.html', 60);
Test::More::ok(SluiceTest::wait_until(sub { $level->() >= 5 }, 2),
    'the held requests reached the root, up to its cap (level ' . $level->() . ')');
close $_ for @socks;
Test::More::ok(SluiceTest::wait_until(sub { $level->() == 0 }, 2),
    'their return took it to 0 (level ' . $level->() . ')');
my $estimate = 0;
for (1 .. 40) {
    my $l = SluiceTest::metric_value($port, '/metrics', 'sluice_quota_level{quota="paced_back"}');
    $estimate = $l if defined $l && $l > $estimate;
    select(undef, undef, undef, 0.05);
}
Test::More::cmp_ok($estimate, '<=', 1, "nginx's estimate stayed at the root's 0 (at most $estimate)");
Test::More::is($level->(), 0, 'and nothing reached the root meanwhile');
--- request
GET /w/index.html
--- response_headers
X-Sluice: PASSED
--- error_code: 200
--- no_error_log
[alert]
[crit]



=== TEST 4d: estimates settled at nothing after a sync give the quota back whole
A quota of 10 that never leaks, at the root. Nine requests estimated at
1 each are sent slowly (limit_rate), so each is counted and synced
before its response ends and settles at 0: the nine come back as a
return. Exactly 10 plain requests then pass, here and at the root: the
returned units neither cost the quota nor the room of the adds that
follow at the root (they did, and nginx admitted a burst every sync).
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
--- config
location /s/ {
    alias html/;
    limit_rate 1k;
    sluice settled_back;
    sluice_charge settled_back weight=0 settle;
}
location /p/ { alias html/; sluice settled_back; }
--- user_files eval
">>> slow.bin\n" . ('x' x 1500) . "\n"
--- init
main::put_quota($main::Root, 'settled_back', { limit => 0, low_burst => 10, high_burst => 10 });
sleep 1.5;
my $port = Test::Nginx::Socket::server_port();
my @socks = SluiceTest::send_and_keep($port, '/s/slow.bin', 9);
my $served = 0;
for my $s (@socks) {
    my $reply = do { local $/; <$s> } // '';
    $served++ if $reply =~ m{^HTTP/1\.1 200};
    close $s;
}
Test::More::is($served, 9, 'the nine estimates were served');
sleep 1;
my $passed = 0;
for (1 .. 30) {
    my $r = SluiceTest::http_request('GET', "http://127.0.0.1:$port/p/index.html");
    $passed++ if $r->{status} == 200;
    select(undef, undef, undef, 0.1);
}
Test::More::is($passed, 10, 'then 10 of 30 plain requests passed over 3 s');
Test::More::is(main::root_level($main::Root, 'settled_back'), 10, 'and the root holds those 10');
--- request
GET /p/index.html
--- error_code: 429
--- no_error_log
[alert]
[crit]



=== TEST 5: seeds from the quota file are removed once a root answers
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
sluice_quotas ../html/seeds.json;
--- config
location /s/ { alias html/; sluice only_in_seed_file; }
--- user_files
>>> seeds.json
[{"name": "only_in_seed_file", "limit": 0, "low_burst": 0, "high_burst": 0}]
--- init
sleep 1.5;
--- request
GET /s/index.html
--- error_code: 200
--- error_log eval
qr/sluice: a quota root answered; 1 seed quota\(s\) from the quota file no root knows were removed/



=== TEST 6: a root that requires a sync token gets it
--- http_config
sluice_root $TEST_NGINX_GUARDED_ROOT_URL;
sluice_sync_interval 200ms;
sluice_sync_token_file $TEST_NGINX_TOKEN_FILE;
--- config
location /g/ { alias html/; sluice guarded; }
--- init
main::put_quota($main::GuardedRoot, 'guarded', { limit => 0, low_burst => 1, high_burst => 1 });
sleep 1.5;
--- request eval
["GET /g/index.html", "GET /g/index.html"]
--- error_code eval
[200, 429]
--- no_error_log
unreachable



=== TEST 7: without the token the root refuses, and nginx says why
--- http_config
sluice_root $TEST_NGINX_GUARDED_ROOT_URL;
sluice_sync_interval 200ms;
--- config
location /g/ { alias html/; sluice guarded; }
--- request
GET /g/index.html
--- wait: 1.5
--- error_log eval
qr/\[warn\] .*sluice: quota root http:\/\/127\.0\.0\.1:\d+ unreachable: .*401/



=== TEST 8: an https root (TLS in front of the root; the CA trusted through SSL_CERT_FILE)
--- main_config
load_module $TEST_NGINX_SLUICE_MODULE;
env SSL_CERT_FILE=$TEST_NGINX_CA_FILE;
--- http_config
sluice_root https://localhost:$TEST_NGINX_TLS_PORT;
sluice_sync_interval 200ms;
server {
    listen 127.0.0.1:$TEST_NGINX_TLS_PORT ssl;
    ssl_certificate $TEST_NGINX_CERT;
    ssl_certificate_key $TEST_NGINX_CERT_KEY;
    location / { proxy_pass $TEST_NGINX_ROOT_URL; }
}
--- config
location /tls/ { alias html/; sluice over_tls; }
--- init
main::put_quota($main::Root, 'over_tls', { limit => 0, low_burst => 1, high_burst => 1 });
sleep 1.5;
--- request eval
["GET /tls/index.html", "GET /tls/index.html"]
--- error_code eval
[200, 429]
--- no_error_log
unreachable



=== TEST 9: every root down: requests pass and the log says so once
--- http_config
sluice_root $TEST_NGINX_DEAD_ROOTS;
sluice_sync_interval 200ms;
--- config
location /free/ { alias html/; sluice not_known_anywhere; }
--- request
GET /free/index.html
--- wait: 1.5
--- error_code: 200
--- grep_error_log eval
qr/sluice: all 2 quota roots unreachable; limiting with local counts only/
--- grep_error_log_out
sluice: all 2 quota roots unreachable; limiting with local counts only



=== TEST 10: every root down: seeds from the quota file still limit, locally
--- http_config
sluice_root $TEST_NGINX_DEAD_ROOTS;
sluice_sync_interval 200ms;
sluice_quotas ../html/seeds.json;
--- config
location /s/ { alias html/; sluice seeded; }
--- user_files
>>> seeds.json
[{"name": "seeded", "limit": 0, "low_burst": 2, "high_burst": 2}]
--- init
sleep 1;
--- request eval
["GET /s/index.html", "GET /s/index.html", "GET /s/index.html"]
--- error_code eval
[200, 200, 429]
