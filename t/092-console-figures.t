# The console's figures against a known load, in headless Chromium: a real
# `sluice root` with an admin token, a real nginx syncing with it every
# 200 ms, and a bounded number of requests sent by this file.
#
# The load: four keys of the per-key quota `api_user` (3 units a key,
# under `api`) filled, then a steady stream (8 s, or
# $SLUICE_CONSOLE_SECONDS) of requests for those full keys and for the
# full window quota `plan_month` (10 a month), all rejected, and for the
# leaky `downloads` (20/s) at twice its limit. The page must show what was
# sent: `api_user` among the busiest quotas with its 4 keys (the hashes
# the CLI computes for them), its fullest key's level 3, and a rejection
# rate near the rate this file was rejected at; `plan_month` in its own
# terms (`10 / month`) at level 10; `downloads` admitting and rejecting
# at the rates this file saw; totals that add up from the rows they sum
# (rejected checks per second, quotas rejecting), and no total that adds
# one quota's units to another's. A root
# without an admin token says anyone can edit it, which is true (a PUT
# without a token is taken).
#
# Saves a screenshot to build/console/figures.png, and to
# $SLUICE_CONSOLE_SHOT when set (docs/console.sh uses it for the README's
# docs/console.png).

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
use SluiceTest qw(free_port start_root stop_root root_call http_request start_nginx);
use SluiceBrowser;

my $Repo = "$FindBin::Bin/..";
my $Token = 'figures-admin-token';
my $dir = File::Temp::tempdir(CLEANUP => 1);
for ([ 'admin.token', "$Token\n" ], [ 'key.secret', "figures-test-key-secret-0123456789\n" ]) {
    open my $fh, '>', "$dir/$_->[0]" or die $!;
    print $fh $_->[1];
    close $fh;
}

my $root = start_root(args => ['--admin-token-file', "$dir/admin.token"]);
$root->{admin_token} = $Token;
my ($nginx, $browser, $open_root);
END {
    $browser->stop if $browser;
    $nginx->{stop}->() if $nginx;
    stop_root($root);
    stop_root($open_root);
}

# Limits of 0.001/s: what the load fills stays full while the page is read
# (it leaks 0.001 units a second).
my ($status, $reply) = root_call($root, 'POST', '/v1/apply', { quotas => [
    { name => 'api', limit => 0.001, low_burst => 1000, high_burst => 1000 },
    { name => 'api_user', parent => 'api', limit => 0.001, low_burst => 3, high_burst => 3,
      per_key => JSON::PP::true },
    { name => 'plan_month', limit => 10, window => 'month' },
    { name => 'downloads', limit => 20, low_burst => 20, high_burst => 20 },
] });
is($status, 200, 'a per-key quota under a leaky one, a month window quota and a leaky one are applied')
    or diag explain $reply;

my $port = free_port();
$nginx = start_nginx(
    http => <<"EOF",
    sluice_root $root->{url};
    sluice_sync_interval 200ms;
    sluice_host_id figures-edge;
    sluice_key_secret_file $dir/key.secret;
    server {
        listen 127.0.0.1:$port;
        location /api/ { sluice api_user key=\$arg_user; root html; }
        location /plan/ { sluice plan_month; root html; }
        location /dl/ { sluice downloads; root html; }
    }
EOF
    files => { 'api/x' => "api\n", 'plan/x' => "plan\n", 'dl/x' => "dl\n" },
);

my @users = qw(u1 u2 u3 u4);
sub get_api { http_request('GET', "http://127.0.0.1:$port/api/x?user=$_[0]")->{status} }
sub get_plan { http_request('GET', "http://127.0.0.1:$port/plan/x")->{status} }
sub get_dl { http_request('GET', "http://127.0.0.1:$port/dl/x")->{status} }

# --- The fill: exact counts ------------------------------------------------
# Until nginx has the quotas from the root, checks pass as UNKNOWN.
my $deadline = time + 15;
sleep 0.1 until time > $deadline
    || JSON::PP::decode_json(http_request('GET', "$root->{url}/v1/overview")->{content})
        ->{totals}{limiters_seen};
sleep 0.5;
my $filled = time;
my @fill = map { my $u = $_; map { get_api($u) } 1 .. 3 } @users;
is_deeply(\@fill, [(200) x 12], 'each of the 4 keys is admitted 3 times');
my @plan = map { get_plan() } 1 .. 10;
is_deeply(\@plan, [(200) x 10], 'plan_month admits its 10');

$browser = SluiceBrowser->start(window => [1400, 1200]);
$browser->get("$root->{url}/ui");
$browser->type('#token', $Token);
$browser->click('#token-use');
$browser->click('#refresh option[value="1000"]');
ok($browser->wait_for(q{document.querySelector('#busiest tr[data-quota="api_user"]')}, 20),
    'api_user, a per-key quota, is among the busiest quotas');

# --- A steady stream for ~8 s ---------------------------------------------------
my ($api_rejected, $plan_rejected, $dl_passed, $dl_rejected, $other) = (0, 0, 0, 0, 0);
my $started = time;
my $next = $started;
my $i = 0;
while (time < $started + ($ENV{SLUICE_CONSOLE_SECONDS} || 8)) {
    # Every 50 ms two checks of api_user (different full keys) and two of
    # downloads, every 100 ms one of plan_month: about 40/s, 40/s, 10/s.
    for (1 .. 2) {
        get_api($users[$i++ % @users]) == 429 ? $api_rejected++ : $other++;
        get_dl() == 200 ? $dl_passed++ : $dl_rejected++;
    }
    get_plan() == 429 ? $plan_rejected++ : $other++ if $i % 4 == 0;
    $next += 0.05;
    sleep($next - time) if $next > time;
}
my $seconds = time - $started;
is($other, 0, 'every check of a full key or of the full month was rejected');
my %sent = (api_user => $api_rejected / $seconds, plan_month => $plan_rejected / $seconds,
    downloads => $dl_rejected / $seconds, admitted => $dl_passed / $seconds);
note(sprintf 'rejected %.1f/s on api_user, %.1f/s on plan_month, %.1f/s on downloads; admitted %.1f/s',
    @sent{qw(api_user plan_month downloads admitted)});

# What the page shows, read from one refresh (the 'updated' tick).
my $page = $browser->js(q{
    const tick = document.getElementById('updated').getAttribute('data-tick');
    const value = (node) => node ? Number(node.getAttribute('data-value')) : null;
    const rows = {};
    for (const tr of document.querySelectorAll('#busiest tbody tr')) {
        const field = (f) => tr.querySelector(`[data-field="${f}"]`);
        rows[tr.getAttribute('data-quota')] = {
            terms: field('terms').textContent,
            parent: tr.children[2].textContent,
            level: value(field('level')),
            fill_rate: value(field('fill_rate')),
            rejecting: value(field('rejecting')),
            rejected_rate: value(field('rejected_rate')),
            keys: value(field('keys')),
            busiest: field('keys') ? field('keys').getAttribute('title') : null,
        };
    }
    return {
        tick,
        rows,
        rejected: value(document.getElementById('total-rejected')),
        rejecting: value(document.getElementById('total-rejecting')),
        admitted: value(document.getElementById('total-admitted')),
        counters: document.getElementById('total-counters').textContent,
        keys: [...document.querySelectorAll('#keys tbody tr')].map((tr) => [
            tr.getAttribute('data-key'), tr.children[0].textContent,
            value(tr.querySelector('[data-field="level"]')), tr.children[5].textContent]),
    };
});
my $rows = $page->{rows};
# A level of 3 leaked 0.001 units a second since the fill.
my $leaked = 0.001 * (time - $filled) + 0.01;
my ($user, $month, $api, $dl) = @$rows{qw(api_user plan_month api downloads)};
ok($user && $month && $api && $dl, 'api, api_user, plan_month and downloads are all listed')
    or diag explain $page;

# --- The per-key quota: keys, level, rejections -----------------------------------
is($user->{terms}, '0.001 /s per key', 'api_user: its limit in its own terms');
is($user->{keys}, 4, '... its 4 keys');
my %hash_of;
for my $u (@users) {
    my $json = qx{"@{[SluiceTest::sluice_bin()]}" quota --root $root->{url} --token $Token --json key api_user --key $u --secret-file $dir/key.secret};
    $hash_of{ JSON::PP::decode_json($json)->{key} } = $u;
}
my @busiest = split /, /, $user->{busiest} // '';
is(scalar(@busiest), 3, '... its 3 busiest keys named');
is(scalar(grep { $hash_of{$_} } @busiest), 3, '... all of them hashes of the keys sent (as the CLI computes them)');
ok(abs($user->{level} - 3) < $leaked, "... its fullest key's level: the 3 admitted ($user->{level})");
is($user->{rejecting}, 1, '... which rejects every check');
my $ratio = $user->{rejected_rate} / $sent{api_user};
ok($ratio > 0.6 && $ratio < 1.4,
    sprintf('... rejecting %.1f checks/s, as sent (%.1f/s)', $user->{rejected_rate}, $sent{api_user}));
is(scalar(grep { $_->[1] eq 'api_user' && abs($_->[2] - 3) < $leaked && $_->[3] eq '0.001 /s per key'
        && $hash_of{ $_->[0] } } @{ $page->{keys} }),
    4, 'the busiest keys list all 4 keys, by hash, at level 3')
    or diag explain $page->{keys};

# --- The window quota ------------------------------------------------------------------
is($month->{terms}, '10 / month', 'plan_month: 10 a month, not 10 a second');
is($month->{level}, 10, '... its count in this month: the 10 admitted');
$ratio = $month->{rejected_rate} / $sent{plan_month};
ok($ratio > 0.6 && $ratio < 1.4,
    sprintf('... rejecting %.1f checks/s, as sent (%.1f/s)', $month->{rejected_rate}, $sent{plan_month}));

# --- The leaky quota ---------------------------------------------------------------------
is($dl->{terms}, '20 /s', 'downloads: 20 a second');
$ratio = $dl->{rejected_rate} / $sent{downloads};
ok($ratio > 0.6 && $ratio < 1.4,
    sprintf('... rejecting %.1f checks/s, as sent (%.1f/s)', $dl->{rejected_rate}, $sent{downloads}));
$ratio = $dl->{fill_rate} / $sent{admitted};
ok($ratio > 0.6 && $ratio < 1.4,
    sprintf('... filling at %.1f units/s, as admitted (%.1f/s)', $dl->{fill_rate}, $sent{admitted}));

# --- The parent and the totals ---------------------------------------------------------
ok(abs($api->{level} - 12) < 4 * $leaked, "api holds its keys' 12 units (level $api->{level})");
is($api->{rejected_rate}, 0, '... and no rejection: each counts on the quota the request named');
my @rejecting = grep { $_->{rejected_rate} > 0 } values %$rows;
is($page->{rejecting}, scalar(@rejecting), "quotas rejecting: the $page->{rejecting} rows with rejections");
my $sum = 0;
$sum += $_->{rejected_rate} for values %$rows;
# Each figure is written to six significant digits: a sum of rounded
# rows and the rounded total differ by a few in the sixth digit.
ok(abs($page->{rejected} - $sum) < 2e-5 * (1 + $sum),
    "rejected checks per second ($page->{rejected}) is the rows' sum ($sum)");
# Each quota's fill rate is on its own row, in its own units: no total
# adds one quota's units to another's (downloads' to plan_month's), nor
# counts a request once per tree it was checked in.
ok(!defined $page->{admitted}, 'no total of admitted units across quotas');
like($page->{counters}, qr/^3 with a counter, 4 keys$/, 'three quotas with a counter, four keys beside them');

# --- The screenshot: the per-key quota's editor open ------------------------------------
# Found and clicked in one step: the table is rebuilt at every refresh,
# and an element found first may be gone by the click (stale).
$browser->js(q{document.querySelector('#busiest tr[data-quota="api_user"] button').click()});
ok($browser->wait_for(q{document.getElementById('editor-name').textContent === 'api_user'
        && document.getElementById('editor-kind').textContent.startsWith('0.001 /s per key')
        && document.querySelector('#chart-level polyline')}),
    "the editor opens on api_user, with its terms");
is($browser->js(q{return document.getElementById('edit-limit-label').textContent}),
    'limit (units per second: leaky bucket)', "... the limit's unit beside its field");
$browser->click('#edit-window option[value="1d"]');
is($browser->js(q{return document.getElementById('edit-limit-label').textContent}),
    'limit (units per 1d window)', '... which follows the window chosen');
$browser->click('#edit-window option[value=""]');
$browser->js(q{window.scrollTo(0, 0)});
make_path("$Repo/build/console");
ok($browser->screenshot("$Repo/build/console/figures.png") > 10_000,
    'a screenshot is saved to build/console/figures.png');
$browser->screenshot($ENV{SLUICE_CONSOLE_SHOT}) if $ENV{SLUICE_CONSOLE_SHOT};

# --- A root without an admin token is open to everyone, and says so -----------------------
$open_root = start_root();
$browser->get("$open_root->{url}/ui");
ok($browser->wait_for(q{document.getElementById('updated').getAttribute('data-tick')}),
    'a root without an admin token serves the console');
like($browser->js(q{return document.getElementById('auth-status').textContent}),
    qr/no admin token, so anyone who can reach it .* can create, edit and delete quotas/,
    '... which says that anyone can edit');
is($browser->js(q{return document.getElementById('token-form').hidden}), JSON::PP::true,
    '... and asks for no token');
($status) = root_call($open_root, 'PUT', '/v1/quotas/anyone', { limit => 1 });
is($status, 201, '... which is true: a PUT without a token creates a quota');

done_testing();
