# sluice_charge: weight known only after the response, counted in the log
# phase. A charge after a static file ($bytes_sent) and after a proxied
# response ($upstream_http_x_tokens from a small upstream server in the
# same nginx), if=, settle in both directions, debt carried over to the
# next request, internal redirects and subrequests charged once, an
# upstream that closes early, bad weights, $sluice_charge_status in the
# access log.
#
# Limits are 0 (nothing leaks while a block runs) unless said otherwise,
# so the level is the sum of what was charged. A `sluice <name>
# weight=0` check asks "is the quota full already?": it rejects once the
# level has reached high_burst.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use SluiceTest ();

# The key "stolen" (hashed with the built-in secret, as the CLI does) is
# denied by an override of the per-key template "tenants".
our $Stolen = do {
    my $bin = SluiceTest::sluice_bin();
    my $hash = `$bin quota hash --key stolen`;
    chomp $hash;
    $hash;
};

our $Quotas = <<"JSON";
{"quotas": [
  {"name": "tenants", "limit": 0, "low_burst": 100, "high_burst": 100, "per_key": true,
   "overrides": [{"key_hash": "$Stolen", "deny": true}]},
  {"name": "bytes", "limit": 0, "low_burst": 5000, "high_burst": 5000},
  {"name": "tokens", "limit": 0, "low_burst": 1000, "high_burst": 1000},
  {"name": "failed", "limit": 0, "low_burst": 3, "high_burst": 3},
  {"name": "closed", "limit": 0, "low_burst": 0, "high_burst": 0},
  {"name": "per_user", "limit": 0, "low_burst": 1000, "high_burst": 1000, "per_key": true}
]}
JSON

# The upstream: answers /tokens?t=N with "X-Tokens: N", /login with 401
# unless pw=secret, /close by closing the connection without a response.
our $Upstream = <<'CONF';
server {
    listen 127.0.0.1:$TEST_NGINX_RAND_PORT_1;
    location /tokens { add_header X-Tokens $arg_t; return 200 "tokens\n"; }
    location /login {
        if ($arg_pw != secret) { return 401; }
        return 200 "welcome\n";
    }
    location /close { return 444; }
}
map $status $failed_login { 401 1; default 0; }
log_format charge '$uri $status $sluice_status $sluice_charge_status';
CONF

add_block_preprocessor(sub {
    my $block = shift;
    SluiceTest::load_sluice_module($block);
    $block->set_value(http_config => "sluice_zone 1m;\nsluice_quotas ../html/quotas.json;\n"
        . $Upstream . ($block->http_config // ''));
    $block->set_value(user_files => ">>> quotas.json\n$Quotas\n>>> big.bin\n" . ('x' x 3000)
        . "\n" . ($block->user_files // ''));
});

no_root_location();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: bytes sent are charged after a static file, and the debt rejects the next request
--- config
access_log logs/access.log charge;
location / { root html; sluice bytes weight=0; sluice_charge bytes weight=$bytes_sent; }
--- request eval
["GET /big.bin", "GET /big.bin", "GET /big.bin"]
--- error_code eval
[200, 200, 429]
--- access_log
/big.bin 200 PASSED CHARGED



=== TEST 1b: a request the checks rejected is not charged (its 429 would deepen the debt)
--- config
access_log logs/access.log charge;
location / {
    root html;
    # The refusal is the 3 KB file: two would put "bytes" over 5000.
    error_page 429 /big.bin;
    sluice closed;
    sluice_charge bytes weight=$bytes_sent;
}
location = /b { root html; sluice bytes weight=0; }
--- user_files
>>> b
b
--- request eval
["GET /big.bin", "GET /big.bin", "GET /b"]
--- error_code eval
[429, 429, 200]
--- access_log
/big.bin 429 REJECTED SKIPPED



=== TEST 1b2: a request a deny override refuses (403) is not charged either
--- config
access_log logs/access.log charge;
location / {
    root html;
    # The refusal is the 3 KB file: two would put "bytes" over 5000.
    error_page 403 /big.bin;
    sluice tenants key=$http_x_tenant;
    sluice_charge bytes weight=$bytes_sent;
}
location = /b { root html; sluice bytes weight=0; }
--- user_files
>>> b
b
--- request eval
["GET /big.bin", "GET /big.bin", "GET /b"]
--- more_headers eval
["X-Tenant: stolen", "X-Tenant: stolen", ""]
--- error_code eval
[403, 403, 200]
--- access_log
/big.bin 403 DENIED SKIPPED



=== TEST 1b3: a request without the key no_key=reject needs is refused (429 NO_KEY), not charged
--- config
access_log logs/access.log charge;
location / {
    root html;
    error_page 429 /big.bin;
    sluice tenants key=$http_x_tenant no_key=reject;
    sluice_charge bytes weight=$bytes_sent;
}
location = /b { root html; sluice bytes weight=0; }
--- user_files
>>> b
b
--- request eval
["GET /big.bin", "GET /big.bin", "GET /b"]
--- error_code eval
[429, 429, 200]
--- access_log
/big.bin 429 NO_KEY SKIPPED



=== TEST 1c: in dry run a request over the limit is served and charged
--- config
access_log logs/access.log charge;
sluice_dry_run on;
location / { root html; sluice closed; sluice_charge bytes weight=$bytes_sent; }
--- request
GET /big.bin
--- error_code: 200
--- access_log
/big.bin 200 REJECTED_DRY_RUN CHARGED



=== TEST 2: a charge is counted in full past the limit: one response of 3 KB puts a 1 KB quota in debt
--- http_config
sluice_log_level info;
--- config
location / { root html; sluice tokens weight=0; sluice_charge tokens weight=$body_bytes_sent; }
--- request eval
["GET /big.bin", "GET /big.bin"]
--- error_code eval
[200, 429]



=== TEST 3: tokens an upstream reports in a header are charged per request
--- config
access_log logs/access.log charge;
location /tokens {
    sluice tokens weight=0;
    sluice_charge tokens weight=$upstream_http_x_tokens;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
--- request eval
["GET /tokens?t=600", "GET /tokens?t=400", "GET /tokens?t=1"]
--- error_code eval
[200, 200, 429]
--- access_log
/tokens 200 PASSED CHARGED



=== TEST 4: if= charges only failed logins (map $status), and a user over the limit gets 429
--- config
access_log logs/access.log charge;
location /login {
    sluice failed weight=0;
    sluice_charge failed weight=1 if=$failed_login;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
--- request eval
["GET /login?pw=a", "GET /login?pw=b", "GET /login?pw=secret", "GET /login?pw=c",
 "GET /login?pw=secret"]
--- error_code eval
[401, 401, 200, 401, 429]
--- access_log
/login 401 PASSED CHARGED



=== TEST 4b: a login that did not fail is not charged (SKIPPED)
--- config
access_log logs/access.log charge;
location /login {
    sluice failed weight=0;
    sluice_charge failed weight=1 if=$failed_login;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
--- request
GET /login?pw=secret
--- error_code: 200
--- access_log
/login 200 PASSED SKIPPED



=== TEST 5: settle gives back what an estimate overcounted: four estimates of 600 that cost 100 each fit a 1000 quota
--- config
access_log logs/access.log charge;
location /tokens {
    sluice tokens weight=$arg_est;
    sluice_charge tokens weight=$upstream_http_x_tokens settle;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
--- request eval
["GET /tokens?t=100&est=600", "GET /tokens?t=100&est=600", "GET /tokens?t=100&est=600",
 "GET /tokens?t=100&est=600", "GET /tokens?t=100&est=700"]
--- error_code eval
[200, 200, 200, 200, 429]
--- access_log
/tokens 200 PASSED SETTLED



=== TEST 6: settle charges what the response cost beyond its estimate
--- config
access_log logs/access.log charge;
location /tokens {
    sluice tokens weight=$arg_est;
    sluice_charge tokens weight=$upstream_http_x_tokens settle;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
--- request eval
["GET /tokens?t=900&est=100", "GET /tokens?t=1&est=200"]
--- error_code eval
[200, 429]
--- access_log
/tokens 200 PASSED SETTLED



=== TEST 7: without a check to settle, settle charges the whole weight
--- config
access_log logs/access.log charge;
location /tokens {
    sluice_charge tokens weight=$upstream_http_x_tokens settle;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
location /check { root html; sluice tokens weight=$arg_est; }
--- user_files
>>> check
ok
--- request eval
["GET /tokens?t=700", "GET /check?est=400"]
--- error_code eval
[200, 429]
--- access_log
/tokens 200 - CHARGED



=== TEST 8: an upstream that closes early reports no cost: nothing is charged (SKIPPED)
--- config
access_log logs/access.log charge;
location /close {
    sluice tokens weight=$arg_est;
    sluice_charge tokens weight=$upstream_http_x_tokens settle;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
--- request
GET /close?est=400
--- error_code: 502
--- access_log
/close 502 PASSED SKIPPED
--- error_log eval
qr/upstream prematurely closed connection/



=== TEST 8b: after an upstream closed early, the estimate stands: 400 + 600 fit 1000, one more does not
--- config
location /close {
    sluice tokens weight=$arg_est;
    sluice_charge tokens weight=$upstream_http_x_tokens settle;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
location /check { root html; sluice tokens weight=$arg_est; }
--- user_files
>>> check
ok
--- request eval
["GET /close?est=400", "GET /check?est=600", "GET /check?est=1"]
--- error_code eval
[502, 200, 429]



=== TEST 9: an internal redirect (index) is charged once
--- config
location / { root html; index big.bin; sluice tokens weight=0; sluice_charge tokens weight=600; }
--- request eval
["GET /", "GET /", "GET /"]
--- error_code eval
[200, 200, 429]



=== TEST 10: a subrequest is not charged, even logged (log_subrequest on): only its main request is
--- config
log_subrequest on;
access_log logs/access.log charge;
location /ssi/ { alias html/; ssi on; sluice tokens weight=0; sluice_charge tokens weight=400; }
location /inner/ { alias html/; sluice_charge tokens weight=400; }
--- user_files
>>> page.html
[<!--# include virtual="/inner/part.txt" -->]
>>> part.txt
inner
--- request eval
["GET /ssi/page.html", "GET /ssi/page.html", "GET /ssi/page.html", "GET /ssi/page.html"]
--- error_code eval
[200, 200, 200, 429]



=== TEST 11: a weight that is no number charges nothing and is logged
--- config
access_log logs/access.log charge;
location /tokens {
    sluice_charge tokens weight=$upstream_http_x_tokens;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
--- request
GET /tokens?t=12abc
--- error_code: 200
--- access_log
/tokens 200 - INVALID_WEIGHT
--- error_log eval
qr/\[error\] .*sluice: nothing charged to quota "tokens": weight "12abc" is not a non-negative integer/



=== TEST 11b: a weight that is no number is counted as a weight error, and charges nothing
--- config
location /tokens {
    sluice tokens weight=0;
    sluice_charge tokens weight=$upstream_http_x_tokens;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
location = /metrics { sluice_metrics; }
--- request eval
["GET /tokens?t=5000x", "GET /tokens?t=1", "GET /metrics"]
--- error_code eval
[200, 200, 200]
--- response_body_like eval
[qr/tokens/, qr/tokens/, qr/sluice_weight_errors_total\{reason="invalid"\} 1\n/]



=== TEST 12: a per-key quota is charged per key
--- config
location /tokens {
    sluice per_user key=$arg_user weight=0;
    sluice_charge per_user key=$arg_user weight=$upstream_http_x_tokens;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
--- request eval
["GET /tokens?t=1500&user=alice", "GET /tokens?t=1&user=alice", "GET /tokens?t=1&user=bob"]
--- error_code eval
[200, 429, 200]



=== TEST 13: charges inherit from the server level, and a location's own replace them
--- config
sluice_charge tokens weight=700;
location /a { root html; sluice tokens weight=0; }
location /b { root html; sluice tokens weight=0; sluice_charge bytes weight=700; }
--- user_files
>>> a
a
>>> b
b
--- request eval
["GET /b", "GET /b", "GET /a", "GET /a", "GET /b"]
--- error_code eval
[200, 200, 200, 200, 429]



=== TEST 14: every form of sluice_charge starts (http, server and location level)
--- http_config
sluice_charge bytes weight=$bytes_sent;
--- config
sluice_charge tokens weight=1 if=$failed_login;
location /a { root html; sluice_charge per_user key=$arg_user weight=$arg_w if=$arg_c settle; }
location /b { root html; sluice_charge s3_${arg_bucket}_read weight=$body_bytes_sent; }
--- user_files
>>> a
a
--- request
GET /a?user=u&w=3&c=1
--- error_code: 200
--- no_error_log
[emerg]
[alert]



=== TEST 15: sluice_charge without weight=
--- config
location /t { sluice_charge tokens; }
--- must_die
--- error_log eval
qr/\[emerg\] .*"sluice_charge" needs "weight=", e\.g\. weight=\$bytes_sent in .*nginx\.conf:\d+/



=== TEST 16: sluice_charge with an unknown parameter
--- config
location /t { sluice_charge tokens weight=1 wait=1s; }
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid parameter "wait=1s" in .*nginx\.conf:\d+/



=== TEST 17: sluice_charge with a weight that is no number
--- config
location /t { sluice_charge tokens weight=-3; }
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid weight "-3": must be a non-negative integer or a variable in .*nginx\.conf:\d+/



=== TEST 18: sluice_charge with an empty if= or key=
--- config
location /t { sluice_charge tokens weight=1 if=; }
--- must_die
--- error_log eval
qr/\[emerg\] .*"if=" needs a value, e\.g\. if=\$failed_login in .*nginx\.conf:\d+/



=== TEST 19: settle twice
--- config
location /t { sluice_charge tokens weight=1 settle settle; }
--- must_die
--- error_log eval
qr/\[emerg\] .*duplicate parameter "settle" in .*nginx\.conf:\d+/



=== TEST 20: an invalid literal quota name
--- config
location /t { sluice_charge "bad name" weight=1; }
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid quota name "bad name": .* in .*nginx\.conf:\d+/



=== TEST 21: more than eight charges at one level
--- config
location /t {
    sluice_charge a1 weight=1; sluice_charge a2 weight=1; sluice_charge a3 weight=1;
    sluice_charge a4 weight=1; sluice_charge a5 weight=1; sluice_charge a6 weight=1;
    sluice_charge a7 weight=1; sluice_charge a8 weight=1; sluice_charge a9 weight=1;
}
--- must_die
--- error_log eval
qr/\[emerg\] .*too many "sluice_charge" directives at one level \(at most 8\) in .*nginx\.conf:\d+/



=== TEST 22: an unknown variable in a charge's weight
--- config
location /t { sluice_charge tokens weight=$no_such_thing; }
--- must_die
--- error_log eval
qr/\[emerg\] .*unknown "no_such_thing" variable/



=== TEST 23: too many arguments is nginx's own error
--- config
location /t { sluice_charge tokens weight=1 key=a if=b settle extra; }
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid number of arguments in "sluice_charge" directive in .*nginx\.conf:\d+/
