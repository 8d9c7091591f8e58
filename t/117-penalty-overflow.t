# Penalties come only from what a key did (issue 35): with no room for
# keys (`sluice_keys 0`), every key is decided on its template's own
# counter (the `shared` overflow mode), which stands for all of them. A
# client sending fresh keys is rejected once that counter is full, and
# starts no penalty: before, each fresh key got a 15-minute penalty of
# its own (Retry-After: 900) after one request.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use SluiceTest ();

our $Quotas = <<'JSON';
{"quotas": [
  {"name": "login", "limit": 0.001, "low_burst": 2, "high_burst": 2, "per_key": true,
   "penalty": "15m"}
]}
JSON

add_block_preprocessor(sub {
    my $block = shift;
    SluiceTest::load_sluice_module($block);
    $block->set_value(http_config => "sluice_zone 1m;\nsluice_keys 0;\n"
        . "sluice_quotas ../html/quotas.json;\n" . ($block->http_config // ''));
    $block->set_value(user_files => ">>> quotas.json\n$Quotas");
});

no_root_location();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: fresh keys on a full template counter are rejected, none penalized
--- config
location / {
    root html;
    sluice login key=$http_x_token;
    sluice_headers on;
    add_header X-Sluice $sluice_status always;
}
location = /m { sluice_metrics; }
--- request eval
["GET /index.html", "GET /index.html", "GET /index.html", "GET /index.html",
 "GET /index.html", "GET /m"]
--- more_headers eval
["X-Token: k1", "X-Token: k2", "X-Token: bob", "X-Token: k4", "X-Token: k5", ""]
--- error_code eval
[200, 200, 429, 429, 429, 200]
--- response_headers eval
["X-Sluice: KEY_OVERFLOW", "X-Sluice: KEY_OVERFLOW", "X-Sluice: REJECTED", "X-Sluice: REJECTED",
 "X-Sluice: REJECTED", ""]
--- response_body_like eval
["", "", "", "", "", qr/^sluice_penalties_started_total 0$/m]
--- no_error_log
a penalty bars
