# Per-key quotas (standalone, a local quota file): each key its own
# counter, keys from headers, arguments and binary variables, empty keys,
# dry run, the log line (the key's hash, never the key), a tiny key
# section that never gives a live key's place away (a spray of other keys
# cannot reset a key's count), the overflow modes of a full section,
# metrics, a secret file, and bad configuration.
#
# `per_user` is a template: every key gets 3 units (limit 0.001/s, so
# nothing leaks while a block runs), under `all_users` (1000 units).

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use SluiceTest ();

sub port { Test::Nginx::Socket::server_port() }

sub status {
    my ($path, $headers) = @_;
    SluiceTest::http_request('GET', 'http://127.0.0.1:' . port() . $path, $headers)->{status};
}

sub metric {
    my ($name) = @_;
    my $text = SluiceTest::http_request('GET', 'http://127.0.0.1:' . port() . '/m')->{content};
    return $text =~ /^\Q$name\E (\d+)$/m ? $1 : undef;
}

our $Quotas = <<'JSON';
{"quotas": [
  {"name": "all_users", "limit": 0.001, "low_burst": 1000, "high_burst": 1000},
  {"name": "per_user", "parent": "all_users", "limit": 0.001, "low_burst": 3,
   "high_burst": 3, "per_key": true},
  {"name": "per_ip", "limit": 0.001, "low_burst": 2, "high_burst": 2, "per_key": true},
  {"name": "plain", "limit": 0.001, "low_burst": 2, "high_burst": 2},
  {"name": "pkw", "limit": 10, "low_burst": 10, "high_burst": 10, "window": "1d",
   "per_key": true}
]}
JSON

add_block_preprocessor(sub {
    my $block = shift;
    SluiceTest::load_sluice_module($block);
    $block->set_value(http_config => "sluice_zone 1m;\nsluice_quotas ../html/quotas.json;\n"
        . ($block->http_config // ''))
        unless defined $block->must_die;
    $block->set_value(user_files => ">>> quotas.json\n$Quotas" . ($block->user_files // ''));
});

no_root_location();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: each key has its own counter; another key still passes
--- config
location / {
    root html;
    sluice per_user key=$http_x_api_token;
    add_header X-Sluice $sluice_status always;
}
--- request eval
["GET /index.html", "GET /index.html", "GET /index.html", "GET /index.html", "GET /index.html"]
--- more_headers eval
["X-Api-Token: alice", "X-Api-Token: alice", "X-Api-Token: alice", "X-Api-Token: alice",
 "X-Api-Token: bob"]
--- error_code eval
[200, 200, 200, 429, 200]
--- response_headers eval
["X-Sluice: PASSED", "X-Sluice: PASSED", "X-Sluice: PASSED", "X-Sluice: REJECTED",
 "X-Sluice: PASSED"]



=== TEST 2: an empty key is not checked and not counted, and says so
--- config
location / {
    root html;
    sluice per_ip key=$http_x_missing;
    add_header X-Sluice $sluice_status always;
}
--- request eval
["GET /index.html", "GET /index.html", "GET /index.html"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["X-Sluice: NO_KEY", "X-Sluice: NO_KEY", "X-Sluice: NO_KEY"]



=== TEST 2b: no_key=reject refuses a request without its key with sluice_status, says NO_KEY, counts nothing
--- config
location / {
    root html;
    sluice per_ip key=$http_x_token no_key=reject;
    add_header X-Sluice $sluice_status always;
}
location /pass/ { alias html/; sluice per_ip key=$http_x_token no_key=pass; }
location /missing/ { alias html/; sluice per_ip key=$http_x_token no_key=reject; sluice_status 401; }
location = /m { sluice_metrics; }
--- request eval
["GET /index.html", "GET /index.html", "GET /pass/index.html", "GET /missing/index.html",
 "GET /index.html", "GET /m"]
--- more_headers eval
["", "X-Token: t1", "", "", "X-Token: t1", ""]
--- error_code eval
[429, 200, 200, 401, 200, 200]
--- response_headers eval
["X-Sluice: NO_KEY", "X-Sluice: PASSED", "", "", "X-Sluice: PASSED", ""]
--- response_body_like eval
[qr/429/, qr/./, qr/./, qr/401/, qr/./,
 qr/sluice_checks_total\{quota="per_ip",result="passed"\} 2\n/]



=== TEST 2c: no_key=reject in dry run lets the request through as REJECTED_DRY_RUN
--- config
location / {
    root html;
    sluice_dry_run on;
    sluice per_ip key=$http_x_token no_key=reject;
    add_header X-Sluice $sluice_status always;
}
--- request
GET /index.html
--- error_code: 200
--- response_headers
X-Sluice: REJECTED_DRY_RUN
--- error_log eval
qr/\[error\] .*sluice: limiting requests, dry run, for quota "per_ip": the request has no key \(its key= value is empty, and no_key=reject\)/



=== TEST 3: a key from a query argument
--- config
location / { root html; sluice per_ip key=$arg_user; }
--- request eval
["GET /index.html?user=a", "GET /index.html?user=a", "GET /index.html?user=a",
 "GET /index.html?user=b"]
--- error_code eval
[200, 200, 429, 200]



=== TEST 4: a binary key ($binary_remote_addr) with a weight
--- config
location / { root html; sluice per_ip key=$binary_remote_addr weight=2; }
--- request eval
["GET /index.html", "GET /index.html"]
--- error_code eval
[200, 429]



=== TEST 5: a rejection logs the key's hash, never the key
--- config
location / { root html; sluice per_ip key=$http_x_api_token weight=3; }
--- more_headers
X-Api-Token: sk-live-4242-very-secret
--- request
GET /index.html
--- error_code: 429
--- error_log eval
qr/sluice: limiting requests by quota "per_ip" key [0-9a-f]{16} \(limit 0\.001 \/s per key, weight 3\)/
--- no_error_log
sk-live-4242



=== TEST 6: dry run lets a key over its quota through and marks it
--- config
location / {
    root html;
    sluice per_ip key=$arg_k;
    sluice_dry_run on;
    add_header X-Sluice $sluice_status always;
}
--- request eval
["GET /index.html?k=x", "GET /index.html?k=x", "GET /index.html?k=x"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["X-Sluice: PASSED", "X-Sluice: PASSED", "X-Sluice: REJECTED_DRY_RUN"]



=== TEST 7: a key given to a plain quota is ignored: the quota is shared
--- config
location / { root html; sluice plain key=$arg_k; }
--- request eval
["GET /index.html?k=1", "GET /index.html?k=2", "GET /index.html?k=3"]
--- error_code eval
[200, 200, 429]



=== TEST 8: a keyed check and a named one on one request, all or nothing
--- config
location / { root html; sluice per_ip key=$arg_k; sluice plain; }
--- request eval
["GET /index.html?k=1", "GET /index.html?k=1", "GET /index.html?k=2"]
--- error_code eval
[200, 200, 429]



=== TEST 9: keys of 1 byte and of 64 KiB are counted like any
--- config
large_client_header_buffers 4 128k;
location / { root html; sluice per_ip key=$http_x_key weight=2; }
--- request eval
["GET /index.html", "GET /index.html", "GET /index.html", "GET /index.html"]
--- more_headers eval
["X-Key: k", "X-Key: k", "X-Key: " . ("x" x 65536), "X-Key: " . ("x" x 65536)]
--- error_code eval
[200, 429, 200, 429]



=== TEST 10: a scan of new keys in a tiny key section never takes a live key's place
A section of 20 entries: the scan's keys fill it (their counts never
drain), and the rest share per_ip's own counter (2 units), so they are
rejected once it is full. The busy key keeps its count throughout.
--- http_config
sluice_keys 1k;
--- config
location / { root html; sluice per_ip key=$arg_k; }
--- request eval
[
  "GET /index.html?k=busy", "GET /index.html?k=busy",
  (map { "GET /index.html?k=scan$_" } 1 .. 60),
  "GET /index.html?k=busy",
]
--- error_code_like eval
[qr/^200$/, qr/^200$/, (qr/^(200|429)$/) x 60, qr/^429$/]



=== TEST 10a: a spray of other keys cannot reset a key's count: it stays rejected for its window
The attack of issue 21: the victim spends its 10 a day, idles, a spray of
other keys (each used twice, so each looks busy) fills the key section
past full, and the victim comes back. Its count of 10 still matters all
day, so its entry is never given away: it stays rejected.
--- http_config
sluice_keys 16k;
--- config
location / { root html; sluice pkw key=$http_x_token; }
location = /m { sluice_metrics; }
--- init
my $as = sub { main::status('/index.html', { 'X-Token' => $_[0] }) };
my @before = map { $as->('victim') } 1 .. 15;
Test::More::is_deeply(\@before, [(200) x 10, (429) x 5], 'the victim spends its 10');
Time::HiRes::sleep(1.5);
for my $i (1 .. 600) {
    $as->("spray-$i-" . int(rand(1e9))) for 1 .. 2;
}
my $capacity = main::metric('sluice_key_capacity');
Test::More::cmp_ok(main::metric('sluice_key_overflow_total'), '>', 0,
    "the spray overfilled the section ($capacity entries)");
my @after = map { $as->('victim') } 1 .. 15;
Test::More::is_deeply(\@after, [(429) x 15], 'the victim stays rejected');
--- request
GET /index.html
--- more_headers
X-Token: victim
--- error_code: 429



=== TEST 10b: a full section's newcomers share the template's counter, and say so
--- http_config
sluice_keys 0;
--- config
location / {
    root html;
    sluice per_ip key=$arg_k;
    add_header X-Sluice $sluice_status always;
}
--- request eval
["GET /index.html?k=a", "GET /index.html?k=b", "GET /index.html?k=c"]
--- error_code eval
[200, 200, 429]
--- response_headers eval
["X-Sluice: KEY_OVERFLOW", "X-Sluice: KEY_OVERFLOW", "X-Sluice: REJECTED"]



=== TEST 10c: sluice_key_overflow reject rejects a key without an entry
--- http_config
sluice_keys 0;
sluice_key_overflow reject;
--- config
location / {
    root html;
    sluice per_ip key=$arg_k;
    add_header X-Sluice $sluice_status always;
}
--- request eval
["GET /index.html?k=a", "GET /index.html?k=b"]
--- error_code eval
[429, 429]
--- response_headers eval
["X-Sluice: REJECTED", "X-Sluice: REJECTED"]



=== TEST 10d: sluice_key_overflow pass lets a key without an entry through uncounted
--- http_config
sluice_keys 0;
sluice_key_overflow pass;
--- config
location / {
    root html;
    sluice per_ip key=$arg_k;
    add_header X-Sluice $sluice_status always;
}
--- request eval
["GET /index.html?k=a", "GET /index.html?k=a", "GET /index.html?k=a"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["X-Sluice: KEY_OVERFLOW", "X-Sluice: KEY_OVERFLOW", "X-Sluice: KEY_OVERFLOW"]



=== TEST 10e: a bad sluice_key_overflow fails the configuration with its line
--- http_config
sluice_zone 1m;
sluice_key_overflow sometimes;
--- config
--- must_die
--- error_log eval
qr/invalid value "sometimes": must be "shared", "reject" or "pass" in .*nginx\.conf:\d+/



=== TEST 11: the metrics show the key section and keys by hash only
--- config
location / { root html; sluice per_ip key=$arg_k; }
location = /m { sluice_metrics; }
--- request eval
["GET /index.html?k=topsecret", "GET /m"]
--- response_body_like eval
[qr/./, qr/sluice_keys 1\n(?s:.*)sluice_key_level\{quota="per_ip",key="[0-9a-f]{16}"\} 1\n/]
--- response_body_unlike eval
[qr/^$/, qr/topsecret/]



=== TEST 12: a key secret file is read at startup
--- http_config
sluice_key_secret_file ../html/secret;
--- user_files
>>> secret
0123456789abcdef-fleet-secret
--- config
location / { root html; sluice per_ip key=$arg_k; }
--- request eval
["GET /index.html?k=a", "GET /index.html?k=a", "GET /index.html?k=a"]
--- error_code eval
[200, 200, 429]



=== TEST 13: a missing key secret file fails the configuration with its line
--- http_config
sluice_zone 1m;
sluice_key_secret_file /nonexistent/sluice-secret;
--- config
--- must_die
--- error_log eval
qr/cannot read key secret file "\/nonexistent\/sluice-secret": .* in .*nginx\.conf:\d+/



=== TEST 14: a secret file with too short a secret fails the configuration
--- http_config
sluice_zone 1m;
sluice_key_secret_file ../html/short;
--- user_files
>>> short
tiny
--- config
--- must_die
--- error_log eval
qr/key secret file ".*short" holds 4 bytes of secret, at least 16 are needed .* in .*nginx\.conf:\d+/



=== TEST 15: an empty key= and a duplicate key= are refused
--- http_config
sluice_zone 1m;
--- config
location / { sluice per_ip key=; }
--- must_die
--- error_log eval
qr/"key=" needs a value, e\.g\. key=\$http_x_api_token in .*nginx\.conf:\d+/



=== TEST 16: a duplicate key= parameter is refused
--- http_config
sluice_zone 1m;
--- config
location / { sluice per_ip key=$arg_a key=$arg_b; }
--- must_die
--- error_log eval
qr/duplicate parameter "key=[^"]*" in .*nginx\.conf:\d+/



=== TEST 16b: no_key= takes pass or reject, and needs key=
--- http_config
sluice_zone 1m;
--- config
location /a { sluice per_ip key=$arg_a no_key=deny; }
--- must_die
--- error_log eval
qr/invalid value "no_key=deny": no_key= must be "pass" or "reject" in .*nginx\.conf:\d+/



=== TEST 16c: no_key= without key= is refused
--- http_config
sluice_zone 1m;
--- config
location /a { sluice per_ip no_key=reject; }
--- must_die
--- error_log eval
qr/"no_key=" needs "key=", e\.g\. key=\$http_x_api_token no_key=reject in .*nginx\.conf:\d+/



=== TEST 17: sluice_keys takes a size
--- http_config
sluice_zone 1m;
sluice_keys lots;
--- config
--- must_die
--- error_log eval
qr/invalid size "lots": must be a size up to 49g \(0 for no keys\) in .*nginx\.conf:\d+/



=== TEST 18: with no key section, every key shares the template's own counter
--- http_config
sluice_keys 0;
--- config
location / {
    root html;
    sluice per_ip key=$arg_k;
    add_header X-Sluice $sluice_status always;
}
--- request eval
["GET /index.html?k=a", "GET /index.html?k=a", "GET /index.html?k=a"]
--- error_code eval
[200, 200, 429]
--- response_headers eval
["X-Sluice: KEY_OVERFLOW", "X-Sluice: KEY_OVERFLOW", "X-Sluice: REJECTED"]
