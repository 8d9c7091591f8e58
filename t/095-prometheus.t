# Metric names and what is built on them: real scrapes of a `sluice root`
# and of an nginx with the module syncing to it pass `promtool check
# metrics` (Prometheus naming conventions: `_total` counters, base units
# in names); the alert rules in deploy/prometheus/ pass `promtool check
# rules` and their unit tests; and every metric the alert rules and the
# Grafana dashboard deploy/grafana/sluice.json query exists in those
# scrapes. The dashboard is also checked for the shape Grafana needs, and
# the example deploy/prometheus/prometheus.yml with `promtool check config`.
#
# A plain Test::More file (a root and an nginx), so it runs the same under
# upstream Test::Nginx and under the runner in t/lib.

use strict;
use warnings;

use FindBin ();
use lib "$FindBin::Bin/helpers";
use File::Temp ();
use HTTP::Tiny;
use JSON::PP ();
use Test::More;
use Time::HiRes qw(sleep);
use SluiceTest qw(free_port start_root stop_root root_call http_request start_nginx wait_until);

my $Repo = "$FindBin::Bin/..";
my $Rules = "$Repo/deploy/prometheus/sluice-alerts.yml";
my $RuleTests = "$Repo/deploy/prometheus/sluice-alerts.test.yml";
my $Dashboard = "$Repo/deploy/grafana/sluice.json";
my $Promtool = $ENV{SLUICE_PROMTOOL} // 'promtool';

system("$Promtool --version >/dev/null 2>&1") == 0
    or BAIL_OUT("promtool not found: install the Debian package prometheus (make deps)");

my $root = start_root();
my $nginx;
END {
    $nginx->{stop}->() if $nginx;
    stop_root($root);
}

my ($status) = root_call($root, 'PUT', '/v1/quotas/api', { limit => 5, low_burst => 5, high_burst => 10 });
is($status, 201, 'a quota at the root');
($status) = root_call($root, 'PUT', '/v1/quotas/api_reads', { limit => 5, parent => 'api' });
is($status, 201, 'a child quota at the root (its parent counts its checks too)');
($status) = root_call($root, 'PUT', '/v1/quotas/per_client',
    { limit => 1, low_burst => 2, high_burst => 2, per_key => JSON::PP::true });
is($status, 201, 'a per-key quota at the root');

my $port = free_port();
$nginx = start_nginx(
    http => <<"EOF",
    sluice_root $root->{url};
    sluice_sync_interval 200ms;
    sluice_host_id metrics-edge;
    server {
        listen 127.0.0.1:$port;
        location /api/ { sluice api; root html; }
        location /reads/ { sluice api_reads; root html; }
        location /dry/ { sluice api; sluice_dry_run on; root html; }
        location /nowhere/ { sluice no_such_quota; root html; }
        location /k/ { sluice per_client key=\$arg_client; root html; }
        location = /metrics { sluice_metrics; }
    }
EOF
    files => { 'api/x' => "x\n", 'reads/x' => "x\n", 'dry/x' => "x\n", 'nowhere/x' => "x\n", 'k/x' => "x\n" },
);

# Passed, rejected, dry-run and unknown checks, so every family has samples.
ok(wait_until(sub {
    http_request('GET', "http://127.0.0.1:$port/api/x")->{status} == 429
}, 15), 'nginx holds the quota and rejects over its burst');
http_request('GET', "http://127.0.0.1:$port/dry/x") for 1 .. 3;
http_request('GET', "http://127.0.0.1:$port/nowhere/x");
http_request('GET', "http://127.0.0.1:$port/reads/x");
# A key over its quota, and a keyless check of the per-key quota.
ok(wait_until(sub {
    http_request('GET', "http://127.0.0.1:$port/k/x?client=c1")->{status} == 429
}, 15), 'nginx holds the per-key quota and rejects a key over its burst');
http_request('GET', "http://127.0.0.1:$port/k/x");
ok(wait_until(sub {
    my (undef, $q) = root_call($root, 'GET', '/v1/quotas/api');
    ref $q && $q->{level} > 0;
}, 15), 'the root received the weight');

sub scrape {
    my ($url) = @_;
    my $res = HTTP::Tiny->new(timeout => 5)->get($url);
    is($res->{status}, 200, "GET $url");
    return $res->{content};
}

# `promtool check metrics` on a scrape: no complaint at all.
sub promtool_accepts {
    my ($what, $text) = @_;
    my $dir = File::Temp::tempdir(CLEANUP => 1);
    open my $fh, '>', "$dir/scrape.prom" or die $!;
    print $fh $text;
    close $fh;
    my $out = `$Promtool check metrics < $dir/scrape.prom 2>&1`;
    my $code = $? >> 8;
    is($code, 0, "promtool check metrics accepts the $what scrape");
    is($out, '', "... and finds nothing to lint") or diag $out;
}

# Metric names a scrape exposes, with the series names of histograms.
sub families {
    my ($text) = @_;
    my %names;
    for my $line (split /\n/, $text) {
        next unless $line =~ /^# TYPE (\S+) (\S+)/;
        my ($name, $type) = ($1, $2);
        $names{$name} = $type;
        if ($type eq 'histogram') {
            $names{"${name}_$_"} = 'histogram series' for qw(bucket sum count);
        }
    }
    return \%names;
}

my $root_text = scrape("$root->{url}/metrics");
my $nginx_text = scrape("http://127.0.0.1:$port/metrics");
promtool_accepts('root', $root_text);
promtool_accepts('nginx', $nginx_text);

my $root_names = families($root_text);
my $nginx_names = families($nginx_text);
ok(keys %$root_names >= 20, 'the root exposes its families') or diag explain $root_names;
ok(keys %$nginx_names >= 15, 'nginx exposes its families') or diag explain $nginx_names;
is_deeply([grep { !/^sluice_root_/ } sort keys %$root_names], [],
    "every root metric is named sluice_root_*");
is_deeply([grep { !/^sluice_/ || /^sluice_root_/ } sort keys %$nginx_names], [],
    "every nginx metric is named sluice_* and none sluice_root_* (that is the root's)");
like($nginx_text, qr/^sluice_checks_total\{quota="api",result="rejected"\} [1-9]/m,
    'the nginx scrape has rejections of the quota');
like($nginx_text, qr/^sluice_descendant_checks_total\{quota="api",result="(?:passed|rejected)"\} [1-9]/m,
    '... and the checks of its child');
like($nginx_text, qr/^sluice_sync_root_up\{root="\Q$root->{url}\E"\} 1$/m,
    '... and its sync state with the root');
like($root_text, qr/^sluice_root_syncs_total\{result="ok"\} [1-9]/m, 'the root scrape has syncs');
my %known = (%$root_names, %$nginx_names);

# Metric names a PromQL expression uses.
sub metrics_in {
    my ($expr) = @_;
    my %used;
    $used{$1} = 1 while $expr =~ /\b(sluice_[a-z0-9_]+)/g;
    return sort keys %used;
}

# --- Alert rules ---------------------------------------------------------------
{
    my $out = `$Promtool check rules $Rules 2>&1`;
    is($? >> 8, 0, 'promtool check rules accepts the alert rules') or diag $out;
    like($out, qr/SUCCESS: (\d+) rules found/, '... and finds them');
    $out = `cd $Repo/deploy/prometheus && $Promtool test rules sluice-alerts.test.yml 2>&1`;
    is($? >> 8, 0, 'the alert rules pass their unit tests') or diag $out;
    $out = `$Promtool check config $Repo/deploy/prometheus/prometheus.yml 2>&1`;
    is($? >> 8, 0, 'the example Prometheus configuration is valid, its rule file too') or diag $out;

    open my $fh, '<', $Rules or die "$Rules: $!";
    my @lines = <$fh>;
    close $fh;
    my (@exprs, %alerts);
    for (my $i = 0; $i < @lines; $i++) {
        $alerts{$1} = 1 if $lines[$i] =~ /^\s*-\s*alert:\s*(\S+)/;
        next unless $lines[$i] =~ /^(\s*)expr:\s*(.*?)\s*$/;
        my ($indent, $expr) = (length $1, $2);
        if ($expr eq '|') {
            $expr = '';
            while ($i + 1 < @lines && ($lines[$i + 1] =~ /^(\s*)\S/ ? length $1 : 99) > $indent) {
                $expr .= $lines[++$i];
            }
        }
        push @exprs, $expr;
    }
    is(scalar @exprs, scalar keys %alerts, 'every alert has an expression');
    for my $alert (qw(SluiceRootDown SluiceRootsAllDown SluiceLimiterAllRootsDown
        SluiceLimiterRootUnreachable SluiceZoneNearlyFull SluiceQuotaRejecting)) {
        ok($alerts{$alert}, "alert $alert is defined");
    }
    open $fh, '<', $RuleTests or die "$RuleTests: $!";
    my $tests = do { local $/; <$fh> };
    close $fh;
    for my $alert (sort keys %alerts) {
        like($tests, qr/alertname: \Q$alert\E\n\s*exp_alerts:\s*\n\s*- exp_labels/,
            "alert $alert has a unit test where it fires");
    }
    my @missing = grep { !$known{$_} } map { metrics_in($_) } @exprs;
    is_deeply(\@missing, [], 'every metric the alert rules use exists in the scrapes');
}

# --- The Grafana dashboard ------------------------------------------------------
{
    open my $fh, '<', $Dashboard or die "$Dashboard: $!";
    my $dash = eval { JSON::PP->new->utf8->decode(do { local $/; <$fh> }) };
    close $fh;
    ok($dash, 'the dashboard is JSON') or diag $@;
    $dash //= {};
    ok($dash->{title} && $dash->{uid} && $dash->{schemaVersion}, '... with a title, uid and schema version');
    my @panels = @{ $dash->{panels} // [] };
    ok(@panels >= 20, '... and its panels');
    my %variables = map { $_->{name} => $_ } @{ $dash->{templating}{list} // [] };
    is($variables{datasource}{type}, 'datasource', 'the Prometheus data source is a variable');
    my %builtin = map { $_ => 1 } qw(__rate_interval __interval __range);
    my (%ids, @problems, %used);
    my %types = map { $_ => 1 } qw(row stat timeseries table);
    for my $p (@panels) {
        my $name = $p->{title} // "panel $p->{id}";
        push @problems, "$name: no id" unless defined $p->{id};
        push @problems, "$name: duplicate id" if defined $p->{id} && $ids{ $p->{id} }++;
        push @problems, "$name: unknown type $p->{type}" unless $types{ $p->{type} // '' };
        my $g = $p->{gridPos} // {};
        push @problems, "$name: bad gridPos"
            unless defined $g->{x} && defined $g->{y} && $g->{w} && $g->{h} && $g->{x} + $g->{w} <= 24;
        next if ($p->{type} // '') eq 'row';
        push @problems, "$name: no title" unless $p->{title};
        push @problems, "$name: data source is not \${datasource}"
            unless ($p->{datasource}{uid} // '') eq '${datasource}';
        my @targets = @{ $p->{targets} // [] };
        push @problems, "$name: no query" unless @targets;
        my %refs;
        for my $t (@targets) {
            my $expr = $t->{expr} // '';
            push @problems, "$name: a target without expr" unless $expr;
            push @problems, "$name: duplicate refId" if $refs{ $t->{refId} // '' }++;
            for my $var ($expr =~ /\$\{?(\w+)/g) {
                push @problems, "$name: unknown variable \$$var" unless $variables{$var} || $builtin{$var};
            }
            $used{$_}++ for metrics_in($expr);
        }
    }
    is_deeply(\@problems, [], 'every panel has an id, a known type, a place, its data source and queries');
    my @missing = grep { !$known{$_} } sort keys %used;
    is_deeply(\@missing, [], 'every metric the dashboard queries exists in the scrapes');
    # What an operator needs to see is all there: each family is on some
    # panel, except the counter version (plumbing nothing would plot).
    my %shown = map { $_ => 1 } keys %used;
    $shown{$_} = 1 for qw(sluice_root_counters_version);
    my @unshown = grep { !$shown{$_} && !/_(bucket|sum|count)$/ && $known{$_} ne 'histogram' } sort keys %known;
    is_deeply(\@unshown, [], 'every metric family appears on the dashboard')
        or diag explain \@unshown;
}

done_testing();
