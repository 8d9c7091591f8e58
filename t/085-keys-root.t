# Per-key quotas from a real `sluice root`: a template created at the
# root limits each key, an edit of the template reaches the keys without
# a reload, the root counts keys by hash (never the key), a reload keeps
# the keys' counters, and deleting the template removes its keys.
#
# The blocks run in order on one nginx (master + 2 workers), syncing every
# 200 ms; the root rereads its database every 100 ms. Limits are 0: no
# key ever leaks, so levels are exactly what was admitted.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use JSON::PP ();
use SluiceTest qw(start_root stop_root root_call reload_nginx);

our $Root = start_root();
END { stop_root($Root) }
$ENV{TEST_NGINX_ROOT_URL} = $Root->{url};

add_block_preprocessor(\&SluiceTest::load_sluice_module);

master_on();
workers(2);
no_shuffle();
no_root_location();
run_tests();

sub put_quota {
    my ($name, $body) = @_;
    my ($status, $reply) = root_call($Root, 'PUT', "/v1/quotas/$name", $body);
    Test::More::ok($status >= 200 && $status < 300, "root accepted quota $name ($status)")
        or Test::More::diag(JSON::PP->new->allow_nonref->encode($reply));
}

__DATA__

=== TEST 1: a template created at the root limits each key on its own
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
--- config
location /k/ { alias html/; sluice per_token key=$http_x_token; }
--- init
main::put_quota('per_token', { limit => 0, low_burst => 2, high_burst => 2, per_key => JSON::PP::true });
sleep 1.5;
--- request eval
["GET /k/index.html", "GET /k/index.html", "GET /k/index.html", "GET /k/index.html"]
--- more_headers eval
["X-Token: t-alpha-0001", "X-Token: t-alpha-0001", "X-Token: t-alpha-0001", "X-Token: t-beta-0002"]
--- error_code eval
[200, 200, 429, 200]



=== TEST 2: the root holds the keys by hash, and never the key
--- init
sleep 0.6;
my ($status, $top) = SluiceTest::root_call($main::Root, 'GET', '/v1/quotas/per_token/keys');
Test::More::is($status, 200, 'the root lists the keys');
Test::More::is($top->{keys_held}, 2, 'two keys at the root');
Test::More::is($top->{keys}[0]{level}, 2, 'the busiest key holds its two units');
Test::More::like($top->{keys}[0]{key}, qr/^[0-9a-f]{16}$/, 'listed by hash');
my $text = JSON::PP->new->encode($top);
Test::More::unlike($text, qr/t-alpha|t-beta/, 'no key in the listing');
--- request
GET /k/index.html



=== TEST 3: a bigger burst set at the root reaches the keys without a reload
--- init
main::put_quota('per_token', { limit => 0, low_burst => 4, high_burst => 4, per_key => JSON::PP::true });
sleep 1.5;
--- more_headers
X-Token: t-alpha-0001
--- request eval
["GET /k/index.html", "GET /k/index.html", "GET /k/index.html"]
--- error_code eval
[200, 200, 429]



=== TEST 4: a reload keeps the keys' counters
--- init
main::reload_nginx(server_root());
--- more_headers
X-Token: t-alpha-0001
--- request
GET /k/index.html
--- error_code: 429



=== TEST 5: deleting the template removes its keys: requests pass
--- init
my ($status) = SluiceTest::root_call($main::Root, 'DELETE', '/v1/quotas/per_token');
Test::More::ok($status >= 200 && $status < 300, "root deleted the template ($status)");
sleep 1.5;
--- more_headers
X-Token: t-alpha-0001
--- request eval
["GET /k/index.html", "GET /k/index.html", "GET /k/index.html"]
--- error_code eval
[200, 200, 200]
