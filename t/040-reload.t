# `nginx -s reload` keeps the zone: quotas and counters survive, a changed
# quota file applies without losing counters, and a changed zone size
# copies everything into the new zone.
#
# The blocks run in order on one nginx (master + 2 workers); blocks 2-4
# reload it in --- init. The quota never leaks (limit 0), so its level is
# exactly what was admitted.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use SluiceTest qw(reload_nginx);

master_on();
workers(2);
no_shuffle();
run_tests();

sub rewrite {
    my ($file, $edit) = @_;
    open my $in, '<', $file or die "$file: $!";
    local $_ = do { local $/; <$in> };
    close $in;
    $edit->();
    open my $out, '>', $file or die "$file: $!";
    print $out $_;
    close $out;
}

__DATA__

=== TEST 1: two of three units used before any reload
--- main_config
load_module $TEST_NGINX_SLUICE_MODULE;
--- http_config
sluice_zone 1m;
sluice_quotas ../html/quotas.json;
--- config
location /q/ { alias html/; sluice q; }
--- user_files
>>> quotas.json
[{"name": "q", "limit": 0, "low_burst": 3, "high_burst": 3}]
--- request eval
["GET /q/index.html", "GET /q/index.html"]
--- error_code eval
[200, 200]



=== TEST 2: after a reload the counter still holds the two units
--- init
main::reload_nginx(server_root());
--- request eval
["GET /q/index.html", "GET /q/index.html"]
--- error_code eval
[200, 429]



=== TEST 3: a bigger burst in the quota file applies on reload, counter kept
--- init
main::rewrite(server_root() . "/html/quotas.json", sub { s/"low_burst": 3, "high_burst": 3/"low_burst": 5, "high_burst": 5/ });
main::reload_nginx(server_root());
--- request eval
["GET /q/index.html", "GET /q/index.html", "GET /q/index.html"]
--- error_code eval
[200, 200, 429]



=== TEST 4: a new zone size copies quotas and counters into the new zone
--- init
main::rewrite(server_root() . "/conf/nginx.conf", sub { s/sluice_zone 1m;/sluice_zone 2m;/ });
main::reload_nginx(server_root());
--- request
GET /q/index.html
--- error_code: 429
--- error_log eval
qr/sluice: zone "sluice" changed size: 1 quotas and their counters copied from the old zone, 0 did not fit/



=== TEST 5: a quota file with a value of the wrong type fails the reload, naming the quota, the field and the line; the running configuration stays
--- init
main::rewrite(server_root() . "/html/quotas.json", sub { s/"limit": 0/"limit": "none"/ });
main::reload_nginx(server_root());
--- request
GET /q/index.html
--- error_code: 429
--- error_log eval
qr/\[emerg\] .*invalid quota file ".*quotas\.json": quotas\[0\]\.limit \(quota "q"\): invalid rate "none": expected a number, or a rate such as 10\/m, 100\/h or 5\/s \(10r\/m as nginx writes it\) at line 1, column \d+ in .*nginx\.conf:\d+/
