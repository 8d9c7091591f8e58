# Limiting with a local quota file (standalone, no roots): pass and
# reject, status code, dry run, headers, $sluice_status, weights,
# hierarchy, weight 0, unknown names (and their log line), several
# checks, inheritance, and a request charged once across internal
# redirects and subrequests.
#
# Limits are 0.001/s, so next to nothing leaks while a block runs: a quota
# with bursts of 3 passes exactly 3 units. Where a check must see a bucket
# exactly full (weight 0), the quota's limit is 0: it never leaks.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use SluiceTest ();

our $Quotas = <<'JSON';
{"quotas": [
  {"name": "three", "limit": 0.001, "low_burst": 3, "high_burst": 3},
  {"name": "zero", "limit": 0.001, "low_burst": 0, "high_burst": 0},
  {"name": "one", "limit": 0.001, "low_burst": 1, "high_burst": 1},
  {"name": "ten", "limit": 0.001, "low_burst": 10, "high_burst": 10},
  {"name": "frozen_one", "limit": 0, "low_burst": 1, "high_burst": 1},
  {"name": "frozen_ten", "limit": 0, "low_burst": 10, "high_burst": 10},
  {"name": "parent2", "limit": 0.001, "low_burst": 2, "high_burst": 2},
  {"name": "child_a", "parent": "parent2", "limit": 0.001, "low_burst": 100, "high_burst": 100},
  {"name": "child_b", "parent": "parent2", "limit": 0.001, "low_burst": 100, "high_burst": 100},
  {"name": "s3_photos_read", "limit": 0.001, "low_burst": 2, "high_burst": 2}
]}
JSON

add_block_preprocessor(sub {
    my $block = shift;
    SluiceTest::load_sluice_module($block);
    $block->set_value(http_config => "sluice_zone 1m;\nsluice_quotas ../html/quotas.json;\n"
        . "log_format sluice '\$uri \$status \$sluice_status';\n"
        . ($block->http_config // ''));
    $block->set_value(user_files => ">>> quotas.json\n$Quotas" . ($block->user_files // ''));
});

no_root_location();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: a quota passes up to its burst, then rejects with 429
--- config
location / { root html; sluice three; }
--- request eval
["GET /index.html", "GET /index.html", "GET /index.html", "GET /index.html", "GET /index.html"]
--- error_code eval
[200, 200, 200, 429, 429]



=== TEST 2: a rejection is logged at error level with the quota (and why waiting cannot help)
--- config
location / { root html; sluice zero; }
--- request
GET /index.html
--- error_code: 429
--- error_log eval
qr/\[error\] .*sluice: limiting requests by quota "zero" \(limit 0\.001 \/s, weight 1\): it can never pass, the weight is above the quota's high_burst 0, client: 127\.0\.0\.1/



=== TEST 3: sluice_log_level moves the rejection log line
--- config
location / { root html; sluice zero; sluice_log_level notice; }
--- request
GET /index.html
--- error_code: 429
--- error_log eval
qr/\[notice\] .*sluice: limiting requests by quota "zero"/
--- no_error_log
[error]



=== TEST 4: sluice_status sets the rejection status
--- config
location / { root html; sluice zero; sluice_status 503; }
--- request
GET /index.html
--- error_code: 503



=== TEST 5: dry run lets the request through, logs and marks it
--- config
access_log logs/access.log sluice;
location / { root html; sluice zero; sluice_dry_run on; }
--- request
GET /index.html
--- error_code: 200
--- error_log eval
qr/sluice: limiting requests, dry run, by quota "zero"/
--- access_log
/index.html 200 REJECTED_DRY_RUN



=== TEST 6: $sluice_status is PASSED for a request that passed
--- config
access_log logs/access.log sluice;
location / { root html; sluice three; }
--- request
GET /index.html
--- access_log
/index.html 200 PASSED



=== TEST 7: $sluice_status is REJECTED for a rejected request
--- config
access_log logs/access.log sluice;
location / { root html; sluice zero; }
--- request
GET /index.html
--- error_code: 429
--- access_log
/index.html 429 REJECTED



=== TEST 8: $sluice_status is UNKNOWN when no quota has the name
--- config
access_log logs/access.log sluice;
# A name with a variable is looked up per request ($arg_none is empty); a
# literal one missing from sluice_quotas fails nginx -t (010-directives.t).
location / { root html; sluice no_such_quota$arg_none; }
--- request
GET /index.html
--- access_log
/index.html 200 UNKNOWN



=== TEST 9: $sluice_status is empty when the request was not checked
--- config
access_log logs/access.log sluice;
location / { root html; }
--- request
GET /index.html
--- access_log
/index.html 200 -



=== TEST 10: headers on a pass describe the tightest quota
--- config
location / { root html; sluice three; sluice_headers on; }
--- request
GET /index.html
--- response_headers
RateLimit-Policy: "three";q=3;w=3000
RateLimit: "three";r=2;t=1000
!Retry-After



=== TEST 10a: names=hash gives the policy a keyed hash of the quota's name instead (inherited with sluice_headers)
--- config
sluice_headers on names=hash;
location / { root html; sluice three; }
location /off/ { alias html/; sluice three; sluice_headers on names=off; }
--- request
GET /index.html
--- raw_response_headers_like: RateLimit-Policy: "([0-9a-f]{16})";q=3;w=3000\r\nRateLimit: "\1";r=2;t=1000\r\n
--- raw_response_headers_unlike: three



=== TEST 10b: names=off names every policy "quota"
--- request
GET /off/index.html
--- response_headers
RateLimit-Policy: "quota";q=3;w=3000
RateLimit: "quota";r=1;t=2000



=== TEST 11: headers on a rejection add Retry-After
--- config
location / { root html; sluice one; sluice_headers on; }
--- request eval
["GET /index.html", "GET /index.html"]
--- error_code eval
[200, 429]
--- response_headers eval
["RateLimit: \"one\";r=0;t=1000\n!Retry-After", "Retry-After: 1000\nRateLimit-Policy: \"one\";q=1;w=1000\nRateLimit: \"one\";r=0;t=1000"]



=== TEST 12: no headers unless asked for
--- config
location / { root html; sluice one; }
--- request eval
["GET /index.html", "GET /index.html"]
--- error_code eval
[200, 429]
--- response_headers eval
["!RateLimit\n!RateLimit-Policy", "!Retry-After\n!RateLimit"]



=== TEST 13: the weight comes from a variable
--- config
location / { root html; sluice frozen_ten weight=$arg_w; }
--- request eval
["GET /index.html?w=6", "GET /index.html?w=5", "GET /index.html?w=4", "GET /index.html?w=0", "GET /index.html?w=1"]
--- error_code eval
[200, 429, 200, 429, 429]



=== TEST 14: a weight that is not a number is rejected and logged
--- config
access_log logs/access.log sluice;
location / { root html; sluice one weight=$arg_w; }
--- request
GET /index.html?w=lots
--- error_code: 429
--- error_log eval
qr/\[error\] .*sluice: limiting requests for quota "one": weight "lots" is not a non-negative integer/
--- access_log
/index.html 429 REJECTED



=== TEST 14b: ...and nothing was counted: the quota of burst 1 still has its unit
--- request eval
["GET /index.html?w=1", "GET /index.html?w=1"]
--- error_code eval
[200, 429]



=== TEST 15: a fixed weight
--- config
location / { root html; sluice ten weight=4; }
--- request eval
["GET /index.html", "GET /index.html", "GET /index.html"]
--- error_code eval
[200, 200, 429]



=== TEST 16: children share their parent's limit
--- config
location /a/ { alias html/; sluice child_a; }
location /b/ { alias html/; sluice child_b; }
--- request eval
["GET /a/index.html", "GET /b/index.html", "GET /a/index.html", "GET /b/index.html"]
--- error_code eval
[200, 200, 429, 429]



=== TEST 17: a rejection by the parent names it
--- config
location /a/ { alias html/; sluice child_a weight=3; }
--- request
GET /a/index.html
--- error_code: 429
--- error_log eval
qr/sluice: limiting requests by quota "parent2", an ancestor of "child_a" \(limit 0\.001 \/s, weight 3\)/



=== TEST 18: weight 0 checks without counting
--- config
location /peek/ { alias html/; sluice frozen_one weight=0; }
location /take/ { alias html/; sluice frozen_one; }
--- request eval
["GET /peek/index.html", "GET /peek/index.html", "GET /peek/index.html", "GET /take/index.html", "GET /take/index.html", "GET /peek/index.html"]
--- error_code eval
[200, 200, 200, 200, 429, 429]



=== TEST 19: unknown names pass
--- config
location / { root html; sluice no_such_quota$arg_none; }
--- request eval
["GET /index.html", "GET /index.html", "GET /index.html"]
--- error_code eval
[200, 200, 200]
--- no_error_log
limiting requests



=== TEST 19a: an unknown name is logged at warn the first time, with the name
--- config
# Names with a variable ($arg_none is empty): a literal name missing from
# sluice_quotas fails nginx -t (010-directives.t).
location / { root html; sluice s3_phtos_read$arg_none; }
location /made/ { alias html/; sluice made_$arg_n; }
location /quiet/ { alias html/; sluice s3_phtos_write$arg_none; sluice_unknown_log off; }
location /both/ { alias html/; sluice three; sluice s3_videos_read$arg_none; }
location /plain/ { alias html/; }
--- request
GET /index.html
--- error_code: 200
--- error_log eval
qr/\[warn\] .*sluice: no quota is named "s3_phtos_read": its checks pass uncounted \(logged at most once every 60s per name\), client: /



=== TEST 19b: more checks of unknown names: the same again, one from a variable (twice), another, one where sluice_unknown_log is off, one beside a known name
--- request eval
["GET /index.html", "GET /index.html", "GET /made/index.html?n=a%22b",
 "GET /made/index.html?n=a%22b", "GET /made/index.html?n=2", "GET /quiet/index.html",
 "GET /quiet/index.html", "GET /both/index.html", "GET /both/index.html"]
--- error_code eval
[200, 200, 200, 200, 200, 200, 200, 200, 200]



=== TEST 19c: ...each name was logged once in all (the log since nginx started), escaped where it holds bytes no quota name has; none where it is off
--- request
GET /plain/index.html
--- grep_error_log eval
qr/no quota is named "[^"]*"/
--- grep_error_log_out
no quota is named "s3_phtos_read"
no quota is named "made_a\x2522b"
no quota is named "made_2"
no quota is named "s3_videos_read"



=== TEST 20: an internal redirect (index) is charged once
--- config
location / { root html; index index.html; sluice three; }
--- request eval
["GET /", "GET /", "GET /", "GET /"]
--- error_code eval
[200, 200, 200, 429]



=== TEST 21: an error page after a rejection is not checked again
--- config
error_page 429 /busy.html;
location = /busy.html { root html; sluice zero; }
location / { root html; sluice zero; }
--- user_files
>>> busy.html
slow down
--- request
GET /index.html
--- error_code: 429
--- response_body
slow down



=== TEST 22: a subrequest is not charged (the main request is)
--- config
location /ssi/ { alias html/; ssi on; sluice one; }
location /inner/ { alias html/; sluice one; }
--- user_files
>>> page.html
[<!--# include virtual="/inner/part.txt" -->]
>>> part.txt
inner
--- request eval
["GET /ssi/page.html", "GET /ssi/page.html"]
--- error_code eval
[200, 429]
--- response_body_like eval
[qr/^\[inner\n\]$/, qr/429/]



=== TEST 23: names built from variables, the S3 way
--- config
location / {
    root html;
    set $s3_rw read;
    sluice s3_${arg_bucket}_${s3_rw};
}
--- request eval
["GET /index.html?bucket=photos", "GET /index.html?bucket=photos", "GET /index.html?bucket=photos", "GET /index.html?bucket=other"]
--- error_code eval
[200, 200, 429, 200]



=== TEST 24: several checks pass together or count nothing
--- config
location /both/ { alias html/; sluice three; sluice one; }
location /three/ { alias html/; sluice three; }
--- request eval
["GET /both/index.html", "GET /both/index.html", "GET /three/index.html", "GET /three/index.html", "GET /three/index.html"]
--- error_code eval
[200, 429, 200, 200, 429]



=== TEST 25: checks are inherited by levels without any; sluice off clears them
--- config
sluice one;
location /inherits/ { alias html/; }
location /free/ { alias html/; sluice off; }
--- request eval
["GET /inherits/index.html", "GET /inherits/index.html", "GET /free/index.html", "GET /free/index.html"]
--- error_code eval
[200, 429, 200, 200]



=== TEST 26: a location's own check replaces the inherited one
--- config
sluice zero;
location /own/ { alias html/; sluice three; }
--- request eval
["GET /own/index.html", "GET /own/index.html"]
--- error_code eval
[200, 200]



=== TEST 27: a return answers before the access phase: not checked
--- config
location = /ret { sluice zero; return 200 "returned\n"; }
--- request
GET /ret
--- error_code: 200
--- response_body
returned



=== TEST 28: the client-chosen weights that escaped counting are rejected with the configured status
--- config
location / { root html; sluice three weight=$arg_w; sluice_status 403; }
--- request eval
["GET /index.html?w=-1", "GET /index.html?w=1e3", "GET /index.html?w=abc", "GET /index.html?w=1.5",
 "GET /index.html?w=3", "GET /index.html?w=1"]
--- error_code eval
[403, 403, 403, 403, 200, 403]



=== TEST 28b: ...logged at the configured level
--- config
location / { root html; sluice three weight=$arg_w; sluice_log_level warn; }
--- request
GET /index.html?w=1e3
--- error_code: 429
--- error_log eval
qr/\[warn\] .*sluice: limiting requests for quota "three": weight "1e3" is not a non-negative integer/



=== TEST 29: an empty weight is rejected unless the configuration says otherwise
--- config
location / { root html; sluice three weight=$arg_w; }
--- request
GET /index.html
--- error_code: 429
--- error_log eval
qr/\[error\] .*sluice: limiting requests for quota "three": the weight is empty/



=== TEST 30: empty=0 checks requests without a weight, without counting them
--- config
location / { root html; sluice frozen_one weight=$arg_w empty=0; }
--- request eval
["GET /index.html", "GET /index.html", "GET /index.html?w=1", "GET /index.html", "GET /index.html?w=1"]
--- error_code eval
[200, 200, 200, 429, 429]



=== TEST 31: empty=<n> counts requests without a weight as n
--- config
location / { root html; sluice three weight=$http_x_cost empty=2; }
--- request eval
["GET /index.html", "GET /index.html"]
--- error_code eval
[200, 429]



=== TEST 32: dry run lets a bad weight through, marked and logged
--- config
access_log logs/access.log sluice;
location / { root html; sluice one weight=$arg_w; sluice_dry_run on; }
--- request
GET /index.html?w=x
--- error_code: 200
--- error_log eval
qr/sluice: limiting requests, dry run, for quota "one": weight "x"/
--- access_log
/index.html 200 REJECTED_DRY_RUN



=== TEST 33: a weight above high_burst can never pass: no Retry-After, no reset in RateLimit (it said t=0), and the log says why
--- config
location / { root html; sluice ten weight=11; sluice_headers on; }
--- request
GET /index.html
--- error_code: 429
--- response_headers
!Retry-After
RateLimit-Policy: "ten";q=10;w=10000
RateLimit: "ten";r=10
--- error_log eval
qr/sluice: limiting requests by quota "ten" \(limit 0\.001 \/s, weight 11\): it can never pass, the weight is above the quota's high_burst 10, client:/



=== TEST 34: a full quota whose limit is 0 never drains...
--- config
location / { root html; sluice frozen_one; sluice_headers on; }
--- request
GET /index.html
--- error_code: 200



=== TEST 34b: ...so its rejection has no Retry-After, and its RateLimit no reset
--- request
GET /index.html
--- error_code: 429
--- response_headers
!Retry-After
RateLimit: "frozen_one";r=0
--- error_log eval
qr/sluice: limiting requests by quota "frozen_one" \(limit 0 \/s, weight 1\): it can never pass, the quota's limit is 0: its level never drains/



=== TEST 35: a rejection waiting can help keeps its Retry-After
--- config
location / { root html; sluice ten weight=6; sluice_headers on; }
--- request eval
["GET /index.html", "GET /index.html"]
--- error_code eval
[200, 429]
--- response_headers eval
["!Retry-After", "Retry-After: 2000"]
--- no_error_log
can never pass
