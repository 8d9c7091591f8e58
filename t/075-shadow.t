# Shadow responses (nginx-conf/shadow.conf): a request over the limit is
# answered with a fake 200 by a named location that error_page sends
# sluice's status to; the real handler never runs. Operators still see the
# rejection in $sluice_status, the error log and the metrics. Only
# sluice's own rejections are shadowed, not a backend's 429.
#
# `return` answers before the access phase, so the real endpoint is a
# static file (or a proxied backend) and only the shadow uses `return`.
# Limits are 0.001/s: a quota with bursts of 2 passes exactly 2.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use SluiceTest ();

our $Quotas = <<'JSON';
{"quotas": [
  {"name": "signup", "limit": 0.001, "low_burst": 2, "high_burst": 2},
  {"name": "api", "limit": 0.001, "low_burst": 1, "high_burst": 1},
  {"name": "closed", "limit": 0.001, "low_burst": 0, "high_burst": 0}
]}
JSON

add_block_preprocessor(sub {
    my $block = shift;
    SluiceTest::load_sluice_module($block);
    $block->set_value(http_config => "sluice_zone 1m;\nsluice_quotas ../html/quotas.json;\n"
        . "log_format sluice '\$uri \$status \$sluice_status';\n"
        . ($block->http_config // ''));
    $block->set_value(user_files => ">>> quotas.json\n$Quotas"
        . ">>> signup.json\n{\"status\": \"ok\", \"from\": \"the real endpoint\"}\n"
        . ($block->user_files // ''));
});

# The shadowed location of the blocks, checking quota $quota (default
# signup): the real answer is a static file.
sub shadowed {
    my $quota = shift // 'signup';
    return <<"NGINX";
location = /signup {
    sluice $quota;
    error_page 429 = \@shadow;
    default_type application/json;
    alias html/signup.json;
}
location \@shadow {
    default_type application/json;
    return 200 '{"status": "ok"}\\n';
}
NGINX
}

no_root_location();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: over the limit, a fake 200 instead of 429
--- config eval
main::shadowed()
--- request eval
["GET /signup", "GET /signup", "GET /signup", "GET /signup"]
--- error_code eval
[200, 200, 200, 200]
--- response_body eval
["{\"status\": \"ok\", \"from\": \"the real endpoint\"}\n",
 "{\"status\": \"ok\", \"from\": \"the real endpoint\"}\n",
 "{\"status\": \"ok\"}\n",
 "{\"status\": \"ok\"}\n"]



=== TEST 2: the shadow answer looks like a success: no limit headers
--- config eval
main::shadowed()
--- request eval
["GET /signup", "GET /signup", "GET /signup"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["Content-Type: application/json\n!Retry-After\n!RateLimit\n!RateLimit-Policy",
 "Content-Type: application/json\n!Retry-After\n!RateLimit\n!RateLimit-Policy",
 "Content-Type: application/json\n!Retry-After\n!RateLimit\n!RateLimit-Policy"]



=== TEST 3: the access log shows a shadowed request as REJECTED with status 200
--- config eval
"access_log logs/access.log sluice;\n" . main::shadowed('closed')
--- request
GET /signup
--- error_code: 200
--- response_body
{"status": "ok"}
--- access_log
/signup 200 REJECTED



=== TEST 4: the error log has the rejection
--- config eval
main::shadowed('closed')
--- request
GET /signup
--- error_code: 200
--- error_log eval
qr/\[error\] .*sluice: limiting requests by quota "closed"/



=== TEST 5: the metrics count shadowed requests as rejected
--- config eval
main::shadowed() . "location = /metrics { sluice_metrics; }\n"
--- request eval
["GET /signup", "GET /signup", "GET /signup", "GET /signup", "GET /metrics"]
--- error_code eval
[200, 200, 200, 200, 200]
--- response_body_like eval
["", "", "", "",
qr/(?s)^(?=.*\nsluice_checks_total\{quota="signup",result="passed"\} 2\n)(?=.*\nsluice_checks_total\{quota="signup",result="rejected"\} 2\n)/]



=== TEST 6: a location without error_page keeps the honest 429 and Retry-After
--- config eval
main::shadowed() . "location /api/ { alias html/; sluice api; sluice_headers on; }\n"
--- request eval
["GET /signup", "GET /signup", "GET /signup", "GET /api/index.html", "GET /api/index.html"]
--- error_code eval
[200, 200, 200, 200, 429]
--- response_headers eval
["", "", "", "!Retry-After", "Retry-After: 1000"]



=== TEST 7: a 429 from the backend is not shadowed
--- http_config
server {
    listen 127.0.0.1:$TEST_NGINX_RAND_PORT_1;
    location / { return 429 "backend busy\n"; }
}
--- config
location = /signup {
    sluice signup;
    error_page 429 = @shadow;
    proxy_pass http://127.0.0.1:$TEST_NGINX_RAND_PORT_1;
}
location @shadow {
    return 200 '{"status": "ok"}\n';
}
--- request eval
["GET /signup", "GET /signup", "GET /signup"]
--- error_code eval
[429, 429, 200]
--- response_body eval
["backend busy\n", "backend busy\n", "{\"status\": \"ok\"}\n"]



=== TEST 8: with sluice_headers on, the shadow answer would carry the limit
--- config
location = /signup {
    sluice signup;
    sluice_headers on;
    error_page 429 = @shadow;
    alias html/signup.json;
}
location @shadow {
    return 200 '{"status": "ok"}\n';
}
--- request eval
["GET /signup", "GET /signup", "GET /signup"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["", "", "Retry-After: 1000"]
