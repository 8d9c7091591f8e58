# Directive parsing: every bad directive stops nginx (and `nginx -t`) with
# an [emerg] naming the problem and the file:line; good ones start.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use SluiceTest ();

add_block_preprocessor(\&SluiceTest::load_sluice_module);

no_shuffle();
run_tests();

__DATA__

=== TEST 1: every directive in its valid form starts and serves
--- http_config
sluice_zone 512k;
sluice_quotas ../html/q.json;
sluice_sync_interval 500ms;
sluice_sync_timeout 300ms;
sluice_in_flight_lease 5s;
sluice_host_id web-01;
sluice_sync_early 0.02 rate=4;
sluice_status 503;
sluice_log_level warn;
sluice_unknown_log notice;
sluice_headers off;
sluice_dry_run off;
--- config
location = /q.json {
    root html;
    sluice api weight=2;
    sluice api_${arg_k} weight=$arg_w empty=0;
}
location = /metrics { sluice_metrics top=5; }
location /off { sluice off; }
location /hidden { sluice api; sluice_headers on names=hash; sluice_unknown_log off; }
--- user_files
>>> q.json
{"quotas": [{"name": "api", "limit": 10, "low_burst": 10, "high_burst": 20}]}
--- request
GET /q.json
--- response_body_like: "api"
--- no_error_log
[emerg]
[alert]
[crit]



=== TEST 2: a zone size that is not a size
--- http_config
sluice_zone abc;
--- config
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid zone size "abc" in .*nginx\.conf:\d+/



=== TEST 3: a zone too small for a table
--- http_config
sluice_zone 64k;
--- config
--- must_die
--- error_log eval
qr/zone size "64k" is too small: sluice needs at least 256k in .*nginx\.conf:\d+/



=== TEST 4: sluice_zone twice
--- http_config
sluice_zone 1m;
sluice_zone 2m;
--- config
--- must_die
--- error_log eval
qr/"sluice_zone" directive is duplicate in .*nginx\.conf:\d+/



=== TEST 5: sluice_zone outside the http level is nginx's own error
--- config
location /t { sluice_zone 1m; }
--- must_die
--- error_log eval
qr/"sluice_zone" directive is not allowed here in .*nginx\.conf:\d+/



=== TEST 6: a root that is not an http(s) base URL
--- http_config
sluice_root http://127.0.0.1:7070 ftp://root.example;
--- config
--- must_die
--- error_log eval
qr/invalid quota root "ftp:\/\/root\.example": must start with "http:\/\/" or "https:\/\/" in .*nginx\.conf:\d+/



=== TEST 7: a root URL with a path
--- http_config
sluice_root http://127.0.0.1:7070/v1/sync;
--- config
--- must_die
--- error_log eval
qr/invalid quota root "http:\/\/127\.0\.0\.1:7070\/v1\/sync": must be a base URL/



=== TEST 8: the same root twice
--- http_config
sluice_root http://127.0.0.1:7070 http://127.0.0.1:7070/;
--- config
--- must_die
--- error_log eval
qr/quota root "http:\/\/127\.0\.0\.1:7070" is duplicate in .*nginx\.conf:\d+/



=== TEST 9: a quota file that does not exist
--- http_config
sluice_quotas ../html/nowhere.json;
--- config
--- must_die
--- error_log eval
qr/cannot read quota file ".*nowhere\.json": No such file or directory .* in .*nginx\.conf:\d+/



=== TEST 10: a quota file that is not JSON
--- http_config
sluice_quotas ../html/q.json;
--- config
--- user_files
>>> q.json
{"quotas": [
--- must_die
--- error_log eval
qr/invalid quota file ".*q\.json": .*EOF while parsing .* at line \d+, column \d+ in .*nginx\.conf:\d+/



=== TEST 11: a quota file with a bad quota names the quota and the field
--- http_config
sluice_quotas ../html/q.json;
--- config
--- user_files
>>> q.json
[{"name": "ok", "limit": 1}, {"name": "bad", "limit": -5}]
--- must_die
--- error_log eval
qr/invalid quota file ".*q\.json": quota "bad": limit: .* in .*nginx\.conf:\d+/



=== TEST 12: a quota file whose parent chain loops
--- http_config
sluice_quotas ../html/q.json;
--- config
--- user_files
>>> q.json
[{"name": "a", "limit": 1, "parent": "b"}, {"name": "b", "limit": 1, "parent": "a"}]
--- must_die
--- error_log eval
qr/invalid quota file ".*q\.json": quota "a": parent: .*/



=== TEST 12a: a YAML quota file is refused by its name, saying what is read
--- http_config
sluice_quotas ../html/q.yaml;
--- config
--- user_files
>>> q.yaml
quotas:
  - name: a
    limit: 1
--- must_die
--- error_log eval
qr/\[emerg\] .*q\.yaml: YAML quota files are not read: quota files are JSON .* or TOML .* in .*nginx\.conf:\d+/



=== TEST 12b: ...and by its look under another name
--- http_config
sluice_quotas ../html/q.json;
--- config
--- user_files
>>> q.json
quotas:
  - name: a
    limit: 1
--- must_die
--- error_log eval
qr/invalid quota file ".*q\.json": not JSON: it looks like YAML; quota files are JSON .*; convert it to one of them in .*nginx\.conf:\d+/



=== TEST 13: a sync interval below 100ms
--- http_config
sluice_sync_interval 50ms;
--- config
--- must_die
--- error_log eval
qr/sync interval "50ms" is out of range \(100ms to 1h\) in .*nginx\.conf:\d+/



=== TEST 14: a sync interval that is not a time
--- http_config
sluice_sync_interval soon;
--- config
--- must_die
--- error_log eval
qr/invalid time "soon" in .*nginx\.conf:\d+/



=== TEST 15: a sync timeout not shorter than the interval
--- http_config
sluice_sync_interval 1s;
sluice_sync_timeout 2s;
--- config
--- must_die
--- error_log eval
qr/"sluice_sync_timeout" \(2000ms\) must be shorter than "sluice_sync_interval" \(1000ms\)/



=== TEST 15b: an in-flight lease of nothing
--- http_config
sluice_in_flight_lease 0;
--- config
--- must_die
--- error_log eval
qr/in-flight lease must be greater than 0 in .*nginx\.conf:\d+/



=== TEST 16: a token file that does not exist
--- http_config
sluice_sync_token_file ../html/missing-token;
--- config
--- must_die
--- error_log eval
qr/cannot read sync token file ".*missing-token": .* in .*nginx\.conf:\d+/



=== TEST 17: an empty token file
--- http_config
sluice_sync_token_file ../html/token;
--- config
--- user_files
>>> token

--- must_die
--- error_log eval
qr/sync token file ".*token" must hold one token of printable characters/



=== TEST 18: a host id with a space
--- http_config
sluice_host_id "web 01";
--- config
--- must_die
--- error_log eval
qr/invalid host id "web 01": must be printable ASCII without spaces in .*nginx\.conf:\d+/



=== TEST 19: early sync needs a fraction of the band
--- http_config
sluice_sync_early 2;
--- config
--- must_die
--- error_log eval
qr/invalid fraction "2": must be a number above 0 and at most 1 in .*nginx\.conf:\d+/



=== TEST 20: a literal quota name with a forbidden byte
--- config
location /t { sluice "s3 photos"; }
--- must_die
--- error_log eval
qr/invalid quota name "s3 photos": .* in .*nginx\.conf:\d+/



=== TEST 21: an unknown parameter
--- config
location /t { sluice api burst=5; }
--- must_die
--- error_log eval
qr/invalid parameter "burst=5" in .*nginx\.conf:\d+/



=== TEST 22: a weight that is neither a number nor a variable
--- config
location /t { sluice api weight=-3; }
--- must_die
--- error_log eval
qr/invalid weight "-3": must be a non-negative integer or a variable in .*nginx\.conf:\d+/



=== TEST 23: a weight over 2^40
--- config
location /t { sluice api weight=1099511627777; }
--- must_die
--- error_log eval
qr/invalid weight "1099511627777": must be at most 1099511627776/



=== TEST 24: a name with an unknown variable is nginx's own error
--- config
location /t { sluice api_$no_such_variable; }
--- must_die
--- error_log eval
qr/unknown "no_such_variable" variable/



=== TEST 25: the same quota twice at one level
--- config
location /t { sluice api; sluice api weight=2; }
--- must_die
--- error_log eval
qr/quota "api" is duplicate in .*nginx\.conf:\d+/



=== TEST 26: more than eight checks at one level
--- config
location /t {
    sluice q1; sluice q2; sluice q3; sluice q4; sluice q5;
    sluice q6; sluice q7; sluice q8; sluice q9;
}
--- must_die
--- error_log eval
qr/too many "sluice" directives at one level \(at most 8\) in .*nginx\.conf:\d+/



=== TEST 27: sluice off beside a check
--- config
location /t { sluice api; sluice off; }
--- must_die
--- error_log eval
qr/"sluice off" cannot be combined with other "sluice" directives at the same level/



=== TEST 28: a status outside 400..599
--- config
location /t { sluice_status 200; }
--- must_die
--- error_log eval
qr/invalid status "200": must be between 400 and 599 in .*nginx\.conf:\d+/



=== TEST 29: dry run takes on or off
--- config
location /t { sluice_dry_run yes; }
--- must_die
--- error_log eval
qr/invalid value "yes" in "sluice_dry_run" directive, it must be "on" or "off" in .*nginx\.conf:\d+/



=== TEST 30: a log level sluice does not log at
--- config
location /t { sluice_log_level debug; }
--- must_die
--- error_log eval
qr/invalid value "debug": must be "info", "notice", "warn" or "error" in .*nginx\.conf:\d+/



=== TEST 30a: unknown names are logged at a level or off
--- config
location /t { sluice_unknown_log quiet; }
--- must_die
--- error_log eval
qr/invalid value "quiet": must be "off", "info", "notice", "warn" or "error" in .*nginx\.conf:\d+/



=== TEST 30b: names= of sluice_headers takes on, hash or off
--- config
location /t { sluice_headers on names=secret; }
--- must_die
--- error_log eval
qr/invalid value "names=secret": names= must be "on", "hash" or "off" in .*nginx\.conf:\d+/



=== TEST 30c: names= says how headers name quotas, so it needs them on
--- config
location /t { sluice_headers off names=hash; }
--- must_die
--- error_log eval
qr/"names=" needs "sluice_headers on" in .*nginx\.conf:\d+/



=== TEST 30d: sluice_headers takes names= only
--- config
location /t { sluice_headers on top=3; }
--- must_die
--- error_log eval
qr/invalid parameter "top=3" in .*nginx\.conf:\d+/



=== TEST 31: metrics with a bad parameter
--- config
location /m { sluice_metrics top=many; }
--- must_die
--- error_log eval
qr/invalid value "top=many": top must be 0 to 100000 in .*nginx\.conf:\d+/



=== TEST 32: too many arguments is nginx's own error
--- config
location /t { sluice a key=$arg_k no_key=reject weight=$arg_w empty=0 wait=1s extra; }
--- must_die
--- error_log eval
qr/invalid number of arguments in "sluice" directive in .*nginx\.conf:\d+/



=== TEST 33: a zone larger than any quota table is refused at configuration time
--- http_config
sluice_zone 100g;
--- config
--- must_die
--- error_log eval
qr/\[emerg\] .*zone size "100g" is larger than sluice can use: the largest quota table fits in \d+m in .*nginx\.conf:\d+/



=== TEST 34: empty= takes reject or a weight
--- config
location /t { sluice api weight=$http_x_cost empty=none; }
--- must_die
--- error_log eval
qr/invalid value "empty=none": empty= must be "reject" or a non-negative integer of at most 1099511627776 in .*nginx\.conf:\d+/



=== TEST 35: empty= needs a weight from a variable
--- config
location /t { sluice api weight=2 empty=0; }
--- must_die
--- error_log eval
qr/"empty=" needs a weight from a variable \(weight=\$\.\.\.\) in .*nginx\.conf:\d+/



=== TEST 36: a parameter given twice
--- config
location /t { sluice api weight=1 weight=2; }
--- must_die
--- error_log eval
qr/duplicate parameter "weight=2" in .*nginx\.conf:\d+/



=== TEST 37: a value of the wrong type names the quota, the field and the line
--- http_config
sluice_quotas ../html/q.json;
--- config
--- user_files
>>> q.json
{"quotas": [
  {"name": "a", "limit": 1},
  {"name": "b", "limit": "ten"}
]}
--- must_die
--- error_log eval
qr/\[emerg\] .*invalid quota file ".*q\.json": quotas\[1\]\.limit \(quota "b"\): invalid rate "ten": expected a number, or a rate such as 10\/m, 100\/h or 5\/s \(10r\/m as nginx writes it\) at line 3, column \d+ in .*nginx\.conf:\d+/



=== TEST 38: "." and ".." are not quota names
--- config
location /t { sluice ..; }
--- must_die
--- error_log eval
qr/invalid quota name "\.\.": "\.\." is not a quota name: .* in .*nginx\.conf:\d+/



=== TEST 39: roots in two groups start and serve
--- http_config
sluice_zone 512k;
sluice_root http://127.0.0.1:1 http://127.0.0.1:2;
sluice_root http://127.0.0.1:3 group=1;
--- config
location = /t { sluice_metrics; }
--- request
GET /t
--- response_body_like: sluice_sync_root_group\{root="http://127\.0\.0\.1:3"\} 1
--- no_error_log
[emerg]



=== TEST 40: a group that is not a number
--- http_config
sluice_root http://127.0.0.1:7070 group=one;
--- config
--- must_die
--- error_log eval
qr/invalid group "one" \(0 to 62\) in .*nginx\.conf:\d+/



=== TEST 41: groups must be numbered from 0 with no gap; the error names the line of the highest group
--- http_config
include ../html/roots.conf;
--- user_files
>>> roots.conf
sluice_root http://127.0.0.1:7070;
sluice_root http://127.0.0.1:7071 group=2;
sluice_root http://127.0.0.1:7072;
--- config
--- must_die
--- error_log eval
qr/invalid sync configuration: root_groups: group 1 has no quota root \(groups are numbered 0 to 2 with no gap\) in .*roots\.conf:2$/m



=== TEST 42: a group without a root
--- http_config
sluice_root group=1;
--- config
--- must_die
--- error_log eval
qr/"sluice_root" needs at least one quota root URL in .*nginx\.conf:\d+/



=== TEST 43: the largest zone a refusal names is accepted (it was refused with its own size)
--- http_config eval
"sluice_zone " . SluiceTest::largest_zone_mib() . "m;"
--- config
location = /t { return 204; }
--- request
GET /t
--- error_code: 204
--- no_error_log
[emerg]



=== TEST 44: one megabyte more is refused, naming the size that is accepted
--- http_config eval
"sluice_zone " . (SluiceTest::largest_zone_mib() + 1) . "m;"
--- config
--- must_die
--- error_log eval
my $n = SluiceTest::largest_zone_mib();
my $over = $n + 1;
qr/\[emerg\] .*zone size "${over}m" is larger than sluice can use: the largest quota table fits in ${n}m in .*nginx\.conf:\d+/



=== TEST 45: quotas that do not fit in the zone name the sluice_zone line
--- http_config
sluice_zone 256k;
sluice_quotas ../html/q.json;
--- config
--- user_files eval
">>> q.json\n" . '{"quotas": [' . join(',', map { qq({"name": "q$_", "limit": 1}) } 1 .. 5000) . ']}'
--- must_die
--- error_log eval
qr/\[emerg\] .*sluice: \d+ quota\(s\) of ".*q\.json" do not fit in zone "sluice" \(first: .*\); make "sluice_zone" larger in .*nginx\.conf:\d+/



=== TEST 46: without sluice_zone, quotas that do not fit name the sluice_quotas line
--- http_config
sluice_keys 0;
sluice_quotas ../html/q.json;
--- config
--- user_files eval
">>> q.json\n" . '{"quotas": [' . join(',', map { qq({"name": "q$_", "limit": 1}) } 1 .. 250000) . ']}'
--- must_die
--- error_log eval
qr/\[emerg\] .*do not fit in zone "sluice" \(first: .*\); set "sluice_zone" above the default 32m for "sluice_quotas" in .*nginx\.conf:\d+/




=== TEST 47: a literal quota name missing from sluice_quotas fails nginx -t at its line when there is no root
--- http_config
sluice_zone 1m;
sluice_quotas ../html/q.json;
--- config
location /a { sluice api_key_minute; }
location /b { sluice api_key_mnute; }
--- user_files
>>> q.json
{"quotas": [{"name": "api_key_minute", "limit": 1}]}
--- must_die
--- error_log eval
qr/\[emerg\] .*no quota is named "api_key_mnute" in ".*q\.json": without sluice_root nothing else defines it, and its checks would pass uncounted in .*nginx\.conf:\d+/



=== TEST 48: ...and of sluice_charge too
--- http_config
sluice_zone 1m;
sluice_quotas ../html/q.json;
--- config
location /a { sluice_charge api_bytes weight=$bytes_sent; }
--- user_files
>>> q.json
{"quotas": [{"name": "api_key_minute", "limit": 1}]}
--- must_die
--- error_log eval
qr/\[emerg\] .*no quota is named "api_bytes" in .*nginx\.conf:\d+/



=== TEST 49: with a root, a literal name missing from sluice_quotas is a warning at its line (the root may have it)
--- http_config
sluice_zone 1m;
sluice_quotas ../html/q.json;
sluice_root http://127.0.0.1:1;
--- config
location /a { sluice api_key_mnute; }
location = /q.json { root html; }
--- user_files
>>> q.json
{"quotas": [{"name": "api_key_minute", "limit": 1}]}
--- request
GET /q.json
--- error_code: 200
--- error_log eval
qr/\[warn\] .*no quota is named "api_key_mnute" in ".*q\.json": its checks pass uncounted unless a root has it in .*nginx\.conf:\d+/



=== TEST 50: a name with variables is not checked at configuration time
--- http_config
sluice_zone 1m;
sluice_quotas ../html/q.json;
--- config
location = /q.json { root html; sluice api_$arg_plan; }
--- user_files
>>> q.json
{"quotas": [{"name": "api_key_minute", "limit": 1}]}
--- request
GET /q.json?plan=key_minute
--- error_code: 200
