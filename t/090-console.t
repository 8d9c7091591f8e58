# The root's web console in a real browser: headless Chromium (Debian's,
# driven by Debian's chromedriver) against a real `sluice root` with an
# admin token and the S3 demo quotas, and a real nginx with the module
# syncing to it every 200 ms while this file sends it requests.
#
# Checks the public view (no names anywhere in the page), the 401 path
# (a wrong token is refused and said so), the tree with the token, the
# limiter with its clock offset, a live value changing as traffic flows,
# an edit made on the page read back through the admin API, an edit of one
# field of a sliding per-key window quota that changes nothing else (the
# page sends a PATCH of the changed fields only), and an edit over a
# change made elsewhere refused with 412. Saves a screenshot to
# build/console/console.png.
#
# A plain Test::More file (a root, an nginx and a browser), so it runs the
# same under upstream Test::Nginx and under the runner in t/lib.

use strict;
use warnings;

use FindBin ();
use lib "$FindBin::Bin/helpers";
use File::Path qw(make_path);
use File::Temp ();
use HTTP::Tiny;
use JSON::PP ();
use Test::More;
use Time::HiRes qw(sleep time);
use SluiceTest qw(free_port start_root stop_root root_call http_request start_nginx wait_until);
use SluiceBrowser;

my $Repo = "$FindBin::Bin/..";
my $Token = 'console-admin-token';
my $dir = File::Temp::tempdir(CLEANUP => 1);
{
    open my $fh, '>', "$dir/admin.token" or die $!;
    print $fh "$Token\n";
    close $fh;
}

my $root = start_root(args => ['--admin-token-file', "$dir/admin.token"]);
$root->{admin_token} = $Token;
my ($nginx, $browser);
END {
    $browser->stop if $browser;
    $nginx->{stop}->() if $nginx;
    stop_root($root);
}

my $S3Quotas = do {
    open my $q, '<', "$Repo/nginx-conf/s3-quotas.json" or die $!;
    local $/;
    JSON::PP::decode_json(<$q>);
};
# The demo file's quotas, however many it grows.
my $QuotaCount = scalar @{ $S3Quotas->{quotas} };
my ($status, $reply) = root_call($root, 'POST', '/v1/apply', $S3Quotas);
is($status, 200, 'the S3 demo quotas are applied') or diag explain $reply;

my $port = free_port();
$nginx = start_nginx(
    http => <<"EOF",
    sluice_root $root->{url};
    sluice_sync_interval 200ms;
    sluice_host_id console-edge-1;
    map \$request_method \$rw { GET read; HEAD read; default write; }
    server {
        listen 127.0.0.1:$port;
        location ^~ /k/ { sluice per_client key=\$arg_client; root html; }
        location ~ ^/(?<bucket>[a-z]+)/ { sluice s3_\${bucket}_\${rw}; root html; }
    }
EOF
    files => { 'photos/cat.jpg' => "meow\n", 'logs/today.log' => "log\n", 'k/x' => "k\n" },
);

# Requests through nginx: reads of photos, writes to logs (405 from the
# static handler, but checked and counted first).
sub traffic {
    my ($n) = @_;
    for (1 .. $n) {
        http_request('GET', "http://127.0.0.1:$port/photos/cat.jpg");
        http_request('PUT', "http://127.0.0.1:$port/logs/today.log", {}, 'x');
    }
}

sub overview {
    my ($token) = @_;
    my $headers = $token ? { Authorization => "Bearer $token" } : {};
    my $res = HTTP::Tiny->new(timeout => 5)->get("$root->{url}/v1/overview", { headers => $headers });
    return ($res->{status}, eval { JSON::PP::decode_json($res->{content}) } // {});
}

traffic(20);
ok(wait_until(sub {
    my (undef, $ov) = overview($Token);
    grep { $_->{id} eq 'console-edge-1' && defined $_->{clock_offset_seconds} } @{ $ov->{limiters} // [] };
}, 15), 'nginx syncs with the root and reports its clock offset');

# --- The API underneath, without a browser -------------------------------
{
    my ($code, $public) = overview();
    is($code, 200, 'the overview answers without a token');
    is($public->{access}, 'public', '... with the public part only');
    ok(!exists $public->{quotas} && !exists $public->{limiters}, '... no quota or limiter names');
    is($public->{totals}{quotas}, $QuotaCount, '... but the totals');
    ($code) = overview('wrong-token');
    is($code, 401, 'a wrong token is refused with 401');
    my $http = HTTP::Tiny->new(timeout => 5);
    my $put = $http->request('PUT', "$root->{url}/v1/quotas/s3_photos_read",
        { content => '{"limit": 1}', headers => { 'Content-Type' => 'application/json' } });
    is($put->{status}, 401, 'an edit without the token is refused with 401');
    my $page = $http->get("$root->{url}/ui");
    is($page->{status}, 200, 'GET /ui serves the console');
    like($page->{headers}{'content-security-policy'} // '', qr/script-src 'self'/,
        '... under a policy that allows only its own scripts');
    is($page->{headers}{'x-frame-options'}, 'DENY', '... and no framing');
    my $home = HTTP::Tiny->new(timeout => 5, max_redirect => 0)->get("$root->{url}/");
    is($home->{status}, 302, 'GET / sends the browser to the console');
}

$browser = SluiceBrowser->start(window => [1400, 1500]);

# --- Public view -----------------------------------------------------------
$browser->get("$root->{url}/ui");
ok($browser->wait_for(q{document.getElementById('updated').getAttribute('data-tick')}),
    'the page loads and reads the overview');
like($browser->js(q{return document.getElementById('auth-status').textContent}),
    qr/Public view/, 'without a token the page says it shows the public view');
is($browser->js(q{return document.getElementById('total-quotas').getAttribute('data-value')}),
    "$QuotaCount", '... with the totals');
is($browser->js(q{return document.body.innerText.includes('s3_photos') || document.body.innerText.includes('console-edge-1')}),
    JSON::PP::false, '... and no quota or limiter name anywhere on the page');

# --- A wrong token: the 401 path ---------------------------------------------
$browser->type('#token', 'not-the-token');
$browser->click('#token-use');
ok($browser->wait_for(q{document.getElementById('auth-status').textContent.includes('401')}),
    'a wrong token is refused and the page says 401');
is($browser->js(q{return document.querySelectorAll('#tree li').length}), 0,
    '... and shows no quota');

# --- The admin token: tree, busiest quotas, limiters ---------------------------
$browser->type('#token', $Token);
$browser->click('#token-use');
ok($browser->wait_for(q{document.querySelector('#tree li[data-quota="s3_photos_read"]')}),
    'with the token the quota tree appears');
is($browser->js(q{return document.querySelectorAll('#tree li').length}), $QuotaCount,
    "... with all $QuotaCount quotas");
is($browser->js(q{return document.querySelector('#tree li[data-quota="s3_photos_read"]')
        .parentElement.closest('li').getAttribute('data-quota')}),
    's3_photos', '... s3_photos_read under s3_photos');
is($browser->js(q{return document.querySelector('#tree li[data-quota="s3_logs"] > .node [data-field="limit"]')
        .getAttribute('data-value')}),
    '50', '... with its limit');
ok($browser->wait_for(q{document.querySelector('#limiters tr[data-limiter="console-edge-1"] [data-field="clock_offset"]')
        .getAttribute('data-value') !== ''}),
    'the limiter is listed with its clock offset');
traffic(10);
ok($browser->wait_for(q{document.querySelector('#busiest tr[data-quota="s3_logs_write"]')}),
    'the busiest quotas are listed');

# --- A live value changing -------------------------------------------------------
my $read_fill = q{document.querySelector('#tree li[data-quota="s3_logs_write"] > .node [data-field="fill_rate"]').getAttribute('data-value')};
my $before = $browser->js("return $read_fill");
my $changed;
my $deadline = time + 20;
while (time < $deadline) {
    traffic(10);
    my $now = $browser->js("return $read_fill");
    if ($now ne $before) {
        $changed = "$before -> $now";
        last;
    }
}
ok($changed, "the fill rate on the page follows the traffic ($changed)") or diag "stayed at $before";

# --- Edit round trip ----------------------------------------------------------------
$browser->click('#tree li[data-quota="s3_photos_read"] button');
ok($browser->wait_for(q{!document.getElementById('editor-section').hidden
        && document.getElementById('edit-limit').value === '15'}),
    'clicking a quota opens its editor with its values');
# Reads at about twice the limit of s3_photos_read (15/s) for a few
# seconds (SLUICE_CONSOLE_SECONDS, default 5; docs/console.png was taken
# with 90), so the screenshot shows its level rising into the band.
for (1 .. 10 * ($ENV{SLUICE_CONSOLE_SECONDS} || 5)) {
    traffic(3);
    sleep 0.1;
}
ok($browser->wait_for(q{(() => {
        const cell = document.querySelector('#busiest tr[data-quota="s3_photos_read"] [data-field="rejected_rate"]');
        return cell && Number(cell.getAttribute('data-value')) > 0
            && Number(document.getElementById('total-rejected').getAttribute('data-value')) > 0;
    })()}),
    'the checks nginx rejected show as a rate, per quota and in total');
$browser->wait_for(q{document.querySelector('#chart-level polyline')}, 10);
make_path("$Repo/build/console");
ok($browser->screenshot("$Repo/build/console/console.png") > 10_000,
    'a screenshot is saved to build/console/console.png');

$browser->type('#edit-limit', '123');
$browser->type('#edit-high', '250');
$browser->click('#edit-save');
ok($browser->wait_for(q{document.getElementById('edit-result').textContent.includes('saved')}),
    'the page saves the edit')
    or diag $browser->js(q{return document.getElementById('edit-result').textContent});
my ($code, $quota) = root_call($root, 'GET', '/v1/quotas/s3_photos_read');
is($code, 200, 'the edited quota reads back through the admin API');
is($quota->{limit}, 123, '... with the limit set on the page');
is($quota->{high_burst}, 250, '... and the high burst');
is($quota->{low_burst}, 15, '... and the low burst left as it was');
is($quota->{parent}, 's3_photos', '... and the same parent');
ok($browser->wait_for(q{document.querySelector('#tree li[data-quota="s3_photos_read"] > .node [data-field="limit"]')
        .getAttribute('data-value') === '123'}),
    'the tree shows the new limit');

$browser->type('#edit-low', '-5');
$browser->click('#edit-save');
ok($browser->wait_for(q{document.getElementById('edit-result').textContent.includes('400')}),
    'an invalid edit shows the root\'s 400 naming the field')
    and like($browser->js(q{return document.getElementById('edit-result').textContent}),
        qr/low_burst/, '... low_burst');

# --- Every field of a quota; an edit changes only what was touched ---------
# A sliding 1m window per client under s3_photos: editing its limit on the
# page used to send only limit, bursts and parent, and turned it into a
# plain leaky quota.
($code) = root_call($root, 'PUT', '/v1/quotas/s3_photos_per_client', {
    limit => 5, low_burst => 4, high_burst => 5, window => '1m',
    sliding => JSON::PP::true, per_key => JSON::PP::true, parent => 's3_photos',
});
is($code, 201, 'a sliding per-key window quota is created under s3_photos');
my (undef, $original) = root_call($root, 'GET', '/v1/quotas/s3_photos_per_client');
ok($browser->wait_for(q{document.querySelector('#tree li[data-quota="s3_photos_per_client"] button')}),
    '... and appears in the tree');
$browser->click('#tree li[data-quota="s3_photos_per_client"] button');
my $editor = q{['edit-limit', 'edit-low', 'edit-high', 'edit-window', 'edit-parent']
    .map((id) => document.getElementById(id).value)
    .concat(['edit-sliding', 'edit-per-key'].map((id) => String(document.getElementById(id).checked)))
    .join(' ')};
ok($browser->wait_for(qq{document.getElementById('editor-name').textContent === 's3_photos_per_client'
        && $editor === '5 4 5 1m s3_photos true true'}),
    'its editor shows every field: limit, bursts, window, parent, sliding, per key')
    or diag $browser->js("return $editor");
$browser->type('#edit-limit', '6');
$browser->click('#edit-save');
ok($browser->wait_for(q{document.getElementById('edit-result').textContent.includes('saved')}),
    'a new limit is saved')
    or diag $browser->js(q{return document.getElementById('edit-result').textContent});
my (undef, $after) = root_call($root, 'GET', '/v1/quotas/s3_photos_per_client');
is($after->{limit}, 6, '... the limit changed');
for my $field (qw(window sliding per_key parent low_burst high_burst)) {
    is(JSON::PP->new->canonical->allow_nonref->encode($after->{$field}),
        JSON::PP->new->canonical->allow_nonref->encode($original->{$field}),
        "... and $field did not");
}
ok($after->{epoch} > $original->{epoch}, '... at a new epoch');

# The window back to none: sliding goes with it, the rest stays.
$browser->click('#edit-window option[value=""]');
ok($browser->wait_for(q{document.getElementById('edit-sliding').disabled
        && !document.getElementById('edit-sliding').checked}),
    'choosing no window unticks and disables sliding');
$browser->click('#edit-save');
ok($browser->wait_for(q{document.getElementById('edit-result').textContent.includes('saved')
        && document.getElementById('editor-kind').textContent.includes('leaky bucket, per key')}),
    'the quota is saved as a leaky bucket');
(undef, $after) = root_call($root, 'GET', '/v1/quotas/s3_photos_per_client');
ok(!exists $after->{window} && !exists $after->{sliding}, '... with no window, not sliding');
is_deeply([@$after{qw(limit low_burst high_burst parent)}, $after->{per_key} ? 'per key' : 'shared'],
    [6, 4, 5, 's3_photos', 'per key'], '... and its other fields as they were');

# Changed elsewhere after the editor was filled: the page does not
# overwrite it unseen.
($code) = root_call($root, 'PATCH', '/v1/quotas/s3_photos_per_client', { limit => 7 });
is($code, 200, 'another client changes the limit through the API');
$browser->type('#edit-high', '6');
$browser->click('#edit-save');
ok($browser->wait_for(q{document.getElementById('edit-result').textContent.includes('412')
        && document.getElementById('edit-limit').value === '7'}),
    'a save over it is refused with 412, and the editor shows the quota as it is now')
    or diag $browser->js(q{return document.getElementById('edit-result').textContent});
(undef, $after) = root_call($root, 'GET', '/v1/quotas/s3_photos_per_client');
is_deeply([@$after{qw(limit high_burst)}], [7, 5], '... the other change stands, nothing overwritten');

# --- Busiest keys, by hash only -------------------------------------------------
($code) = root_call($root, 'PUT', '/v1/quotas/per_client',
    { limit => 1, low_burst => 2, high_burst => 4, per_key => JSON::PP::true });
is($code, 201, 'a per-key quota is created');
my $listed;
$deadline = time + 20;
while (time < $deadline && !$listed) {
    http_request('GET', "http://127.0.0.1:$port/k/x?client=alice-secret-token") for 1 .. 5;
    $listed = $browser->wait_for(q{document.querySelector('#keys tr[data-key]')}, 1);
}
ok($listed, 'the busiest keys appear once a key is over its quota')
    or diag explain [overview($Token)];
like($browser->js(q{return document.querySelector('#keys tr[data-key]').getAttribute('data-key')}),
    qr/^[0-9a-f]{16}$/, '... by its hash');
is($browser->js(q{return document.querySelector('#keys tr[data-key] td').textContent}),
    'per_client', '... under its quota');
is($browser->js(q{return document.body.innerText.includes('alice-secret-token')}),
    JSON::PP::false, '... and the key itself is nowhere on the page');

# --- The token from the address's fragment ---------------------------------
$browser->click('#token-forget');
ok($browser->wait_for(q{document.getElementById('auth-status').textContent.includes('Public view')}),
    'forgetting the token goes back to the public view');
$browser->get('about:blank');
$browser->get("$root->{url}/ui#token=$Token");
ok($browser->wait_for(q{document.querySelector('#tree li[data-quota="s3_photos_read"]')}),
    'a token in the fragment (/ui#token=...) opens the admin view');
is($browser->js(q{return location.hash}), '', '... and is taken out of the address bar');

done_testing();
