# The sluice_metrics location: Prometheus text with table totals, the
# busiest quotas' passed / rejected / dry-run counts (and their
# descendants' for a quota with children), unknown names, and sync state;
# GET and HEAD only.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use SluiceTest ();

add_block_preprocessor(sub {
    my $block = shift;
    SluiceTest::load_sluice_module($block);
    $block->set_value(http_config => "sluice_zone 1m;\nsluice_quotas ../html/quotas.json;\n"
        . "sluice_host_id metrics-test;\n");
    $block->set_value(user_files => <<'FILES' . ($block->user_files // ''));
>>> quotas.json
[{"name": "busy", "limit": 0, "low_burst": 2, "high_burst": 2},
 {"name": "quiet", "limit": 0, "low_burst": 5, "high_burst": 5},
 {"name": "dry", "limit": 0, "low_burst": 0, "high_burst": 0},
 {"name": "photos", "limit": 0, "low_burst": 100, "high_burst": 100},
 {"name": "photos_read", "parent": "photos", "limit": 0, "low_burst": 2, "high_burst": 2}]
FILES
});

no_root_location();
no_shuffle();
run_tests();

__DATA__

=== TEST 1: per-quota counts, unknown names, table and sync state
--- config
location /busy/ { alias html/; sluice busy; }
location /dry/ { alias html/; sluice dry; sluice_dry_run on; }
location /unknown/ { alias html/; sluice nobody_has_this$arg_none; }
location = /metrics { sluice_metrics; }
--- request eval
["GET /busy/index.html", "GET /busy/index.html", "GET /busy/index.html",
 "GET /dry/index.html", "GET /unknown/index.html", "GET /metrics"]
--- error_code eval
[200, 200, 429, 200, 200, 200]
--- response_headers eval
["", "", "", "", "", "Content-Type: text/plain; version=0.0.4; charset=utf-8"]
--- response_body_like eval
["", "", "", "", "",
qr/(?s)^(?=.*\nsluice_quotas 5\n)(?=.*\nsluice_checks_total\{quota="busy",result="passed"\} 2\n)(?=.*\nsluice_checks_total\{quota="busy",result="rejected"\} 1\n)(?=.*\nsluice_checks_total\{quota="dry",result="dry_run_rejected"\} 1\n)(?=.*\nsluice_checks_total\{quota="dry",result="rejected"\} 0\n)(?=.*\nsluice_unknown_checks_total 1\n)(?=.*\nsluice_sync_cycles_total \d+\n)(?=.*\nsluice_info\{version="[^"]+",host_id="metrics-test"\} 1\n)(?=.*\nsluice_table_capacity \d+\n)/]



=== TEST 2: top=N bounds the per-quota series, the rest is summed
--- config
location /busy/ { alias html/; sluice busy; }
location /quiet/ { alias html/; sluice quiet; }
location = /metrics { sluice_metrics top=1; }
--- request eval
["GET /busy/index.html", "GET /busy/index.html", "GET /quiet/index.html", "GET /metrics"]
--- error_code eval
[200, 200, 200, 200]
--- response_body_like eval
["", "", "",
qr/(?s)^(?=.*\nsluice_checks_total\{quota="busy",result="passed"\} 2\n)(?=.*\nsluice_checks_total\{quota="_other",result="passed"\} 1\n)(?!.*quota="quiet")/]



=== TEST 3: with no roots configured there is no per-root series
--- config
location = /metrics { sluice_metrics; }
--- request
GET /metrics
--- response_body_unlike: sluice_sync_root_up\{



=== TEST 4: only GET and HEAD
--- config
location = /metrics { sluice_metrics; }
--- request eval
["POST /metrics\nx=1", "HEAD /metrics"]
--- error_code eval
[405, 200]



=== TEST 5: weight errors and rejections that waiting cannot help are counted
--- config
location /w/ { alias html/; sluice busy weight=$arg_w; }
location /big/ { alias html/; sluice busy weight=5; }
location = /metrics { sluice_metrics; }
--- request eval
["GET /w/index.html?w=x", "GET /w/index.html?w=-1", "GET /w/index.html", "GET /big/index.html",
 "GET /metrics"]
--- error_code eval
[429, 429, 429, 429, 200]
--- response_body_like eval
["", "", "", "",
qr/(?s)^(?=.*\nsluice_weight_errors_total\{reason="invalid"\} 2\n)(?=.*\nsluice_weight_errors_total\{reason="empty"\} 1\n)(?=.*\nsluice_unpassable_rejections_total 1\n)(?=.*\nsluice_checks_total\{quota="busy",result="rejected"\} 1\n)/]



=== TEST 6: an ancestor counts the checks that went through it
--- config
location /read/ { alias html/; sluice photos_read; }
location = /metrics { sluice_metrics; }
--- request eval
["GET /read/index.html", "GET /read/index.html", "GET /read/index.html", "GET /metrics"]
--- error_code eval
[200, 200, 429, 200]
--- response_body_like eval
["", "", "",
qr/(?s)^(?=.*\nsluice_checks_total\{quota="photos",result="passed"\} 0\n)(?=.*\nsluice_descendant_checks_total\{quota="photos",result="passed"\} 2\n)(?=.*\nsluice_descendant_checks_total\{quota="photos",result="rejected"\} 1\n)(?=.*\nsluice_checks_total\{quota="photos_read",result="passed"\} 2\n)(?!.*sluice_descendant_checks_total\{quota="photos_read")/]
