# Two workers share one table: a quota's burst is shared by every worker
# of an nginx, not granted once per worker.
#
# The checks go to a second server listening with `reuseport`, so the
# kernel spreads the connections over both workers; each response names
# the worker that answered it.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use HTTP::Tiny;
use SluiceTest qw(free_port);

$ENV{TEST_NGINX_SHARED_PORT} = free_port();

master_on();
workers(2);
no_shuffle();
run_tests();

# Sends $n requests to $url, each on a new connection; returns the count
# of each status and the set of worker pids that answered.
sub hammer {
    my ($url, $n) = @_;
    my $http = HTTP::Tiny->new(keep_alive => 0, timeout => 5);
    my (%status, %pids);
    for (1 .. $n) {
        my $res = $http->get($url);
        $status{ $res->{status} }++;
        $pids{ $res->{headers}{'x-pid'} }++ if $res->{headers}{'x-pid'};
    }
    return (\%status, \%pids);
}

__DATA__

=== TEST 1: 40 requests over both workers pass exactly the shared burst of 20
--- main_config
load_module $TEST_NGINX_SLUICE_MODULE;
--- http_config
sluice_zone 1m;
sluice_quotas ../html/quotas.json;
server {
    listen 127.0.0.1:$TEST_NGINX_SHARED_PORT reuseport;
    location / {
        root html;
        sluice shared;
        add_header X-Pid $pid always;
    }
}
--- config
location = /ready { return 200 "ready\n"; }
--- user_files
>>> quotas.json
[{"name": "shared", "limit": 0, "low_burst": 20, "high_burst": 20}]
--- init
my ($status, $pids) = main::hammer("http://127.0.0.1:$ENV{TEST_NGINX_SHARED_PORT}/index.html", 40);
Test::More::is($status->{200} // 0, 20, "20 requests passed");
Test::More::is($status->{429} // 0, 20, "20 requests were rejected");
Test::More::cmp_ok(scalar(keys %$pids), '==', 2, "both workers answered");
--- request
GET /ready
--- response_body
ready
--- no_error_log
[alert]
[crit]
