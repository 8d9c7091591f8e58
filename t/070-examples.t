# The configurations in nginx-conf/ work as their comments say. Each is
# copied into a scratch prefix with its quota file, its ports moved to
# free ones (and its root to a real `sluice root` started here), then run
# with our nginx and the module.
#
# A plain Test::More file (it needs several servers per example), so it
# runs the same under upstream Test::Nginx and under the runner in t/lib.

use strict;
use warnings;

use FindBin ();
use lib "$FindBin::Bin/helpers";
use File::Copy qw(copy);
use File::Temp ();
use HTTP::Tiny;
use JSON::PP ();
use Test::More;
use Time::HiRes qw(sleep);
use SluiceTest qw(free_port start_root stop_root root_call http_request);

my $Repo = "$FindBin::Bin/..";
my $Nginx = $ENV{TEST_NGINX_BINARY} || "$Repo/build/nginx/sbin/nginx";
my $Module = $ENV{TEST_NGINX_SLUICE_MODULE}
    || "$Repo/build/nginx/modules/ngx_http_sluice_module.so";
my $Examples = "$Repo/nginx-conf";

my $root = start_root();
END { stop_root($root) }

# Runs nginx with nginx-conf/$conf (and its quota file) in a scratch
# prefix; returns {prefix, port, stop}.
sub run_example {
    my ($conf, $quotas) = @_;
    my $prefix = File::Temp::tempdir(CLEANUP => 1);
    # Workers run as an unprivileged user when nginx starts as root.
    chmod 0755, $prefix;
    mkdir "$prefix/$_", 0755 for qw(conf logs html);
    copy("$Examples/$quotas", "$prefix/conf/$quotas") or die "copy $quotas: $!";
    open my $fh, '>', "$prefix/html/index.html" or die $!;
    print $fh "hello\n";
    close $fh;
    my ($port, $backend) = (free_port(), free_port());
    open my $in, '<', "$Examples/$conf" or die "$conf: $!";
    my $text = do { local $/; <$in> };
    close $in;
    $text =~ s{load_module modules/ngx_http_sluice_module\.so;}{load_module $Module;}
        or die "$conf: no load_module line";
    $text =~ s{127\.0\.0\.1:8080}{127.0.0.1:$port}g;
    $text =~ s{127\.0\.0\.1:8081}{127.0.0.1:$backend}g;
    $text =~ s{http://127\.0\.0\.1:7070}{$root->{url}}g;
    $text =~ s{sluice_sync_interval 1s;}{sluice_sync_interval 200ms;}g;
    open my $out, '>', "$prefix/conf/$conf" or die $!;
    print $out $text;
    close $out;
    my @cmd = ($Nginx, '-p', "$prefix/", '-c', "$prefix/conf/$conf");
    is(system(@cmd, '-t', '-q'), 0, "$conf: nginx -t accepts it");
    is(system(@cmd), 0, "$conf: nginx starts") or BAIL_OUT("cannot start nginx with $conf");
    return {
        prefix => $prefix,
        url => "http://127.0.0.1:$port",
        stop => sub { system(@cmd, '-s', 'stop'); sleep 0.3 },
    };
}

sub get { my ($url, %headers) = @_; http_request('GET', $url, \%headers) }

sub statuses {
    my ($url, $n, %headers) = @_;
    return map { get($url, %headers)->{status} } 1 .. $n;
}

sub count { my ($want, @got) = @_; scalar grep { $_ == $want } @got }

# --- s3.conf: a bucket's reads and writes, by host or by path -------------
{
    my ($status) = root_call($root, 'POST', '/v1/apply', do {
        open my $q, '<', "$Examples/s3-quotas.json" or die $!;
        local $/;
        JSON::PP::decode_json(<$q>);
    });
    ok($status >= 200 && $status < 300, "the root took s3-quotas.json ($status)");
    my $ex = run_example('s3.conf', 's3-quotas.json');
    sleep 1;
    my $res = get("$ex->{url}/cat.jpg", Host => 'photos.s3.example');
    is($res->{status}, 200, 's3: a read passes');
    is($res->{content}, "stored: GET /cat.jpg\n", 's3: and reaches the backend');
    like($res->{headers}{'ratelimit-policy'} // '', qr/^"s3_photos(_read)?";q=\d+;w=\d+$/,
        's3: with a RateLimit-Policy header');
    # 15 + up to 15 more in the band, at 15/s: 60 reads in a burst cannot
    # all pass.
    my @reads = statuses("$ex->{url}/cat.jpg", 60, Host => 'photos.s3.example');
    cmp_ok(count(200, @reads), '>=', 14, 's3: the burst of reads passes');
    cmp_ok(count(429, @reads), '>=', 20, 's3: reads beyond the burst get 429');
    # Path style, another bucket: its own quota.
    my @logs = statuses("$ex->{url}/logs/app.log", 5);
    is(count(200, @logs), 5, 's3: path-style requests to another bucket pass');
    my $put = http_request('PUT', "$ex->{url}/logs/new.log", {}, 'x');
    is($put->{status}, 200, 's3: a write is checked against the write quota');
    sleep 0.3;    # nginx logs a request just after answering it
    open my $log, '<', "$ex->{prefix}/logs/s3-access.log" or die $!;
    my @lines = <$log>;
    ok((grep { /"PUT \/logs\/new\.log HTTP\/1\.1" 200 bucket=logs op=write sluice=PASSED/ } @lines),
        's3: the access log shows bucket, direction and $sluice_status')
        or diag(join '', grep { /PUT/ } @lines);
    ok((grep { /bucket=photos op=read sluice=REJECTED/ } @lines),
        's3: rejected reads are logged as REJECTED');
    my $metrics = get("$ex->{url}/sluice-metrics");
    like($metrics->{content}, qr/sluice_checks_total\{quota="s3_photos_read",result="rejected"\} [1-9]/,
        's3: the metrics count the rejections');

    # Download bandwidth: s3_videos_read_bytes leaks 100 KB/s with a
    # burst of 200 KB. Each download of 64 KiB is charged after it is
    # sent; three leave the bucket below its burst, the fourth passes
    # and puts it in debt, so the fifth is refused until it drains.
    open my $big, '>', "$ex->{prefix}/html/big.bin" or die $!;
    print $big 'v' x 65536;
    close $big;
    my @downloads = statuses("$ex->{url}/videos/big.bin", 5);
    is("@downloads", '200 200 200 200 429', 's3: downloads past the bytes/s quota are refused');
    sleep 1.2;
    is(get("$ex->{url}/videos/big.bin")->{status}, 200,
        's3: once the debt has leaked below the burst, a download passes again');
    sleep 0.6;    # a sync or two (200 ms here): the charges reach the root
    # Six downloads charged about 394 KB, of which about 200 KB have
    # leaked by now (100 KB/s); without the charges the root would hold
    # nothing (the checks count weight 0).
    my (undef, $bytes) = root_call($root, 'GET', '/v1/quotas/s3_videos_read_bytes');
    cmp_ok($bytes->{level}, '>', 30_000, "s3: the root holds the bytes charged ($bytes->{level})");
    open $log, '<', "$ex->{prefix}/logs/s3-access.log" or die $!;
    @lines = <$log>;
    ok((grep { m{"GET /videos/big\.bin HTTP/1\.1" 200 bucket=videos op=read sluice=PASSED bytes=CHARGED} } @lines),
        's3: the access log shows the charge') or diag(join '', grep { /videos/ } @lines);
    $ex->{stop}->();
}

# --- standalone.conf: a local quota file, weights, dry run ----------------
{
    my $ex = run_example('standalone.conf', 'standalone-quotas.json');
    my @api = statuses("$ex->{url}/api/index.html", 40);
    cmp_ok(count(200, @api), '>=', 10, 'standalone: the api burst passes');
    cmp_ok(count(429, @api), '>=', 15, 'standalone: beyond it, 429');
    my @beta = statuses("$ex->{url}/beta/index.html", 10);
    is(count(200, @beta), 10, 'standalone: dry run rejects nothing');
    sleep 0.3;
    open my $log, '<', "$ex->{prefix}/logs/standalone-access.log" or die $!;
    my @lines = <$log>;
    ok((grep { /beta.* 200 sluice=REJECTED_DRY_RUN/ } @lines),
        'standalone: and marks what it would have rejected');
    $ex->{stop}->();
}

# --- app-counts.conf: the application counts, nginx checks with weight 0 --
{
    my ($status) = root_call($root, 'POST', '/v1/apply', do {
        open my $q, '<', "$Examples/app-quotas.json" or die $!;
        local $/;
        JSON::PP::decode_json(<$q>);
    });
    ok($status >= 200 && $status < 300, "the root took app-quotas.json ($status)");
    my $ex = run_example('app-counts.conf', 'app-quotas.json');
    sleep 1;
    my @before = statuses("$ex->{url}/api/x", 20, 'X-Tenant' => 'acme');
    is(count(200, @before), 20, 'app: a tenant under its quota passes');
    # The application (another limiter at the same root) counts acme's
    # usage past its high burst.
    my (undef, $quota) = root_call($root, 'GET', '/v1/quotas/tenant_acme');
    my ($sync) = root_call($root, 'POST', '/v1/sync',
        { limiter => 'app-host', deltas => [{ id => $quota->{id}, delta => 5000 }] });
    is($sync, 200, 'app: the application reported its usage');
    sleep 1.5;
    my @after = statuses("$ex->{url}/api/x", 5, 'X-Tenant' => 'acme');
    is(count(503, @after), 5, 'app: nginx now turns acme away (sluice_status 503)');
    my @other = statuses("$ex->{url}/api/x", 5, 'X-Tenant' => 'globex');
    is(count(200, @other), 5, 'app: other tenants still pass');
    my (undef, $globex) = root_call($root, 'GET', '/v1/quotas/tenant_globex');
    is($globex->{level}, 0, 'app: nginx counted nothing (weight 0)');
    $ex->{stop}->();
}

# --- shadow.conf: a fake 200 over the limit, honest 429s elsewhere --------
{
    my $ex = run_example('shadow.conf', 'shadow-quotas.json');
    my @signups = map { get("$ex->{url}/signup") } 1 .. 12;
    is(count(200, map { $_->{status} } @signups), 12, 'shadow: every sign-up gets a 200');
    my @real = grep { $_->{content} =~ /"served_by": "app"/ } @signups;
    my @fake = grep { $_->{content} eq qq({"status": "ok", "message": "check your inbox"}\n) } @signups;
    # burst 5 (plus at most what leaks at 2/s while this runs)
    cmp_ok(scalar @real, '>=', 5, 'shadow: the burst reaches the application');
    cmp_ok(scalar @fake, '>=', 4, 'shadow: beyond it, the shadow answers');
    is(@real + @fake, 12, 'shadow: and nothing else answers');
    ok(!(grep { exists $_->{headers}{'retry-after'} || exists $_->{headers}{ratelimit} } @signups),
        'shadow: no header gives the limit away');
    my @api = statuses("$ex->{url}/api/x", 30);
    cmp_ok(count(429, @api), '>=', 5, 'shadow: /api/ keeps honest 429s');
    sleep 0.3;
    open my $log, '<', "$ex->{prefix}/logs/shadow-access.log" or die $!;
    my @lines = <$log>;
    ok((grep { m{"GET /signup HTTP/1\.1" 200 sluice=REJECTED} } @lines),
        'shadow: the access log shows shadowed sign-ups as REJECTED');
    $ex->{stop}->();
}

# --- api-product.conf: per-token plans as a ladder of windows -----------
{
    my $ex = run_example('api-product.conf', 'api-product-quotas.json');
    my $api = "$ex->{url}/v1/things";
    is(get($api)->{status}, 401, 'api: a call without a token is refused');
    # The day must not end while this runs (a trial token gets 25 a day).
    my $to_midnight = 86400 - time() % 86400;
    sleep $to_midnight + 0.5 if $to_midnight < 10;
    # Start just after a second begins: the per-second rung counts in
    # UTC seconds.
    my $in_second = sub { my $t = Time::HiRes::time(); $t - int $t };
    sleep 1.02 - $in_second->();
    my $second = int Time::HiRes::time();
    my @burst = map { get($api, 'X-Api-Token' => 'tk_trial_a') } 1 .. 15;
    my $same_second = int(Time::HiRes::time()) == $second;
    my $passed = count(200, map { $_->{status} } @burst);
    if ($same_second) {
        is($passed, 10, 'api: a trial token passes 10 in a second');
    } else {
        cmp_ok($passed, '>=', 10, 'api: a trial token passes 10 in a second (the burst spanned two)');
    }
    my ($refused) = grep { $_->{status} == 429 } @burst;
    ok($refused, 'api: beyond them, 429');
    like($refused->{headers}{'retry-after'} // '', qr/^1$/, 'api: come back next second')
        if $refused;
    is(get($api, 'X-Api-Token' => 'tk_trial_b')->{status}, 200,
        'api: another token has its own counters');
    # 25 a day: spend the rest of the day's allowance, a second at a time.
    my $total = $passed;
    for (1 .. 4) {
        last if $total >= 25;
        sleep 1.02 - $in_second->();
        $total += count(200, map { get($api, 'X-Api-Token' => 'tk_trial_a')->{status} } 1 .. 10);
    }
    is($total, 25, 'api: the day rung stops the token at 25 calls');
    sleep 1.02 - $in_second->();
    my $day = get($api, 'X-Api-Token' => 'tk_trial_a');
    is($day->{status}, 429, 'api: and keeps it stopped in the next second');
    like($day->{headers}{'ratelimit-policy'} // '', qr/^"trial_day";q=25;w=86400$/,
        'api: the day rung is the one that refused');
    my $midnight = 86400 - time() % 86400;
    cmp_ok(abs(($day->{headers}{'retry-after'} // 0) - $midnight), '<=', 2,
        'api: Retry-After points at UTC midnight');
    my @pro = map { get($api, 'X-Api-Token' => 'tk_pro_a')->{status} } 1 .. 30;
    is(count(200, @pro), 30, 'api: a pro token has room for 30 at once');
    sleep 0.3;
    open my $log, '<', "$ex->{prefix}/logs/api-product-access.log" or die $!;
    my @lines = <$log>;
    ok((grep { / 429 plan=trial sluice=REJECTED/ } @lines), 'api: the log shows the plan and the refusal');
    $ex->{stop}->();
}

# --- llm.conf: tokens per minute per API key, estimate then settle ------
{
    my $ex = run_example('llm.conf', 'llm-quotas.json');
    my $api = "$ex->{url}/v1/chat";
    is(get($api)->{status}, 401, 'llm: a call without a key is refused');
    # Ten calls estimated at 4,000 tokens that use 100 each: settled, they
    # hold 1,000 of the key's 10,000, where their estimates (40,000) would
    # have stopped the third.
    my @small = map {
        get($api, 'X-Api-Key' => 'key_a', 'X-Max-Tokens' => 4000, 'X-Test-Tokens' => 100)->{status}
    } 1 .. 10;
    is("@small", join(' ', (200) x 10), 'llm: estimates settled at their use leave room');
    # One that said 4,000 but used 9,000: the rest is charged after it.
    is(get($api, 'X-Api-Key' => 'key_a', 'X-Max-Tokens' => 4000, 'X-Test-Tokens' => 9000)->{status},
        200, 'llm: a call that used more than its estimate passes (the response is gone)');
    my $over = get($api, 'X-Api-Key' => 'key_a', 'X-Max-Tokens' => 1000);
    is($over->{status}, 429, 'llm: the key is then out of tokens');
    like($over->{headers}{'retry-after'} // '', qr/^\d+$/, 'llm: told when to come back');
    is(get($api, 'X-Api-Key' => 'key_b')->{status}, 200, 'llm: another key has its own tokens');
    sleep 0.3;
    open my $log, '<', "$ex->{prefix}/logs/llm-access.log" or die $!;
    my @lines = <$log>;
    ok((grep { / 200 sluice=PASSED tokens=100 charge=SETTLED/ } @lines),
        'llm: the access log shows the use and the settle') or diag(@lines);
    $ex->{stop}->();
}

# --- logins.conf: failed logins per user, settled after the response ----
{
    my $ex = run_example('logins.conf', 'logins-quotas.json');
    my $login = "$ex->{url}/login";
    my %alice = (Authorization => 'Basic YWxpY2U6c2VjcmV0');            # alice:secret
    my %wrong = (Authorization => 'Basic YWxpY2U6Z3Vlc3M=');            # alice:guess
    my %bob = (Authorization => 'Basic Ym9iOmd1ZXNz');                  # bob:guess
    # Successful logins give their unit back: any number of them.
    my @ok = map { get($login, %alice)->{status} } 1 .. 8;
    is("@ok", join(' ', (200) x 8), 'logins: successful logins are not counted');
    my @guesses = map { get($login, %wrong)->{status} } 1 .. 7;
    is("@guesses", '401 401 401 401 401 429 429', 'logins: five failures, then 429');
    is(get($login, %alice)->{status}, 429, 'logins: even with the right password, until one leaks');
    is(get($login, %bob)->{status}, 401, 'logins: another user has his own count');
    sleep 0.3;
    open my $log, '<', "$ex->{prefix}/logs/logins-access.log" or die $!;
    my @lines = <$log>;
    ok((grep { / 401 user=alice sluice=PASSED charge=SETTLED/ } @lines),
        'logins: the access log shows the failure settled') or diag(@lines);
    $ex->{stop}->();
}

done_testing();
