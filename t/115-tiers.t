# Tiers per key from a real `sluice root`, set with the CLI (which hashes
# each key locally and sends only its hash): a default key limited at 3,
# an overridden key at 10, an allowed key never rejected, a denied key
# always rejected (403, `$sluice_status` DENIED); an override edited and
# one removed at the root reach nginx without a reload; a penalty started
# by a rejection at the high burst bars the key with the penalty's end in
# Retry-After, and other keys pass.
#
# The blocks run in order on one nginx (master + 2 workers), syncing every
# 200 ms; the root rereads its database every 100 ms. Limits are 0: no
# key ever leaks, so levels are exactly what was admitted.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use JSON::PP ();
use SluiceTest qw(start_root stop_root root_call);

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

# `sluice quota override TEMPLATE --key KEY ARGS...` against the root.
sub override {
    my ($template, $key, @args) = @_;
    local $ENV{SLUICE_ROOT} = $Root->{url};
    my @cmd = (SluiceTest::sluice_bin(), 'quota', 'override', $template, '--key', $key, @args);
    open(my $fh, '-|', @cmd) or die "cannot run @cmd: $!";
    my $out = do { local $/; <$fh> };
    close $fh;
    Test::More::is($?, 0, "@cmd[1..$#cmd]") or Test::More::diag($out);
}

__DATA__

=== TEST 1: default 3, overridden 10, allowed never rejected, denied 403 DENIED
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
--- config
location /k/ { alias html/; sluice per_token key=$http_x_token; add_header X-Status $sluice_status always; }
--- init
main::put_quota('per_token', { limit => 0, low_burst => 3, high_burst => 3, per_key => JSON::PP::true });
main::override('per_token', 't-paid', '--limit', '0', '--low-burst', '10', '--high-burst', '10');
main::override('per_token', 't-partner', '--allow');
main::override('per_token', 't-stolen', '--deny', '--note', 'leaked in a ticket');
sleep 1.5;
--- request eval
[("GET /k/index.html") x 30]
--- more_headers eval
[("X-Token: t-free") x 4, ("X-Token: t-paid") x 11, ("X-Token: t-partner") x 13, ("X-Token: t-stolen") x 2]
--- error_code eval
[200, 200, 200, 429, (200) x 10, 429, (200) x 13, 403, 403]



=== TEST 1b: the denied key's $sluice_status is DENIED, a full key's REJECTED
--- request eval
["GET /k/index.html", "GET /k/index.html"]
--- more_headers eval
["X-Token: t-free", "X-Token: t-stolen"]
--- error_code eval
[429, 403]
--- response_headers eval
["X-Status: REJECTED", "X-Status: DENIED"]
--- error_log eval
qr/sluice: limiting requests by quota "per_token" key [0-9a-f]{16} \(limit 0 \/s per key, weight 1\): an override denies the key,/



=== TEST 1c: a key over its override is logged with the override's numbers and the template's
--- request
GET /k/index.html
--- more_headers
X-Token: t-paid
--- error_code: 429
--- error_log eval
qr/sluice: limiting requests by quota "per_token" key [0-9a-f]{16} \(limit 0 \/s per key, burst 10, by the key's override; the template's is 0 \/s per key, burst 3, weight 1\): it can never pass, the quota.s limit is 0/



=== TEST 2: the root lists the overrides by hash, never the key
--- init
local $ENV{SLUICE_ROOT} = $main::Root->{url};
my $bin = SluiceTest::sluice_bin();
my $out = `$bin quota overrides per_token 2>&1`;
Test::More::is($?, 0, 'sluice quota overrides');
Test::More::like($out, qr/deny/, 'the deny is listed');
Test::More::like($out, qr/leaked in a ticket/, 'with its note');
Test::More::unlike($out, qr/t-stolen|t-paid|t-partner/, 'no key in the listing');
--- request
GET /k/index.html



=== TEST 3: an override edited and one removed at the root reach nginx without a reload
--- init
main::override('per_token', 't-paid', '--deny');
main::override('per_token', 't-stolen', '--remove');
sleep 1.5;
--- request eval
[("GET /k/index.html") x 5]
--- more_headers eval
["X-Token: t-paid", ("X-Token: t-stolen") x 4]
--- error_code eval
[403, 200, 200, 200, 429]



=== TEST 4: a rejection at the high burst starts a penalty; Retry-After is its end
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
sluice_deny_status 451;
--- config
location /login { alias html/index.html; sluice login key=$http_x_token; sluice_headers on; }
--- init
main::put_quota('login', { limit => 0, low_burst => 2, high_burst => 2, per_key => JSON::PP::true,
                           penalty => '15m' });
sleep 1.5;
--- request eval
[("GET /login") x 5]
--- more_headers eval
[("X-Token: mallory") x 4, "X-Token: alice"]
--- error_code eval
[200, 200, 429, 429, 200]
--- response_headers_like eval
["", "", "Retry-After: (89\\d|900)", "Retry-After: (89\\d|900)", ""]



=== TEST 4b: a request barred by a penalty is logged as the penalty's, with the time it has left
--- request
GET /login
--- more_headers
X-Token: mallory
--- error_code: 429
--- error_log eval
qr/sluice: limiting requests by quota "login" key [0-9a-f]{16} \(limit 0 \/s per key, weight 1\): a penalty bars the key for (89\d|900) s more,/



=== TEST 5: a deny status out of 400..599 fails nginx -t with file:line
--- http_config
sluice_deny_status 200;
--- config
--- must_die
--- error_log eval
qr/invalid status "200": must be between 400 and 599 in .*nginx\.conf:\d+/



=== TEST 6: an overrides size that is not a size fails nginx -t with file:line
--- http_config
sluice_overrides lots;
--- config
--- must_die
--- error_log eval
qr/invalid size "lots": must be a size up to \d+g \(0 for no overrides or penalties\) in .*nginx\.conf:\d+/
