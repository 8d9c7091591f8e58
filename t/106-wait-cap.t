# The default cap on `wait=` holds: a location without `sluice_wait_max`
# holds at most half of `worker_connections` requests at once (every
# worker together), and rejects the rest at once with `sluice_status`
# (429), so held requests can never take every connection and the other
# locations keep answering. `sluice_wait_max` sets another cap.
#
# Each block keeps requests held far longer than it runs (a turn every
# 33 s, `wait=1h`) and reads, within a few seconds, which were answered
# and which are still held. Nothing here asserts how fast nginx is.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(time);
use SluiceTest ();

# A turn every 33 s: 1 passes at once, then 108 fit in wait=1h.
our $Quotas = <<'JSON';
{"quotas": [
  {"name": "glacial", "limit": 0.03, "low_burst": 1, "high_burst": 1}
]}
JSON

add_block_preprocessor(sub {
    my $block = shift;
    SluiceTest::load_sluice_module($block);
    $block->set_value(http_config => "sluice_zone 1m;\nsluice_quotas ../html/quotas.json;\n"
        . ($block->http_config // ''));
    $block->set_value(user_files => ">>> quotas.json\n$Quotas>>> other.html\nother\n");
});

# One process (master_process off): 64 connections in all, a default cap
# of 32.
worker_connections(64);
no_root_location();
no_shuffle();
run_tests();

sub port { Test::Nginx::Socket::server_port() }

# Sends GET $path on $n connections at once and reads what comes back
# within $secs seconds ($n fewer than nginx has free: none is dropped). Returns (a map of status => count of the
# answered, the sockets still unanswered), which the caller closes.
sub send_and_wait {
    my ($path, $n, $secs) = @_;
    my @socks = map {
        IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => port(), Timeout => 5)
            or die "connect: $!";
    } 1 .. $n;
    print $_ "GET $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" for @socks;
    my (%raw, %answered);
    my $select = IO::Select->new(@socks);
    my $deadline = time + $secs;
    while ($select->count && time < $deadline) {
        for my $s ($select->can_read(0.2)) {
            my $got = sysread($s, my $buf, 65536);
            if ($got) {
                $raw{$s} .= $buf;
                next;
            }
            my ($status) = ($raw{$s} // '') =~ m{^HTTP/1\.\d (\d{3})};
            $answered{$status // 0}++;
            $select->remove($s);
            close $s;
        }
    }
    return (\%answered, [$select->handles]);
}

# The status of GET $path, or 0 when nothing answers within 5 s (a
# connection nginx has no room to take).
sub status_within {
    my ($path) = @_;
    my ($answered, $left) = send_and_wait($path, 1, 5);
    close $_ for @$left;
    my ($status) = keys %$answered;
    return $status // 0;
}

# One series of the metrics text, as a number (undef when absent).
sub metric { SluiceTest::metric_value(port(), '/metrics', $_[0]) }

# Waits until $n requests are held; false after 10 s.
sub held { my $n = shift; SluiceTest::wait_until(sub { (metric('sluice_delay_waiting') // -1) == $n }, 10) }

__DATA__

=== TEST 1: without sluice_wait_max, half of worker_connections are held at once; the rest are rejected at once and other locations keep answering
--- config
location = /slow.html { root html; sluice glacial wait=1h; sluice_headers on; try_files /other.html =404; }
location = /other.html { root html; }
location = /metrics { sluice_metrics; }
--- init
# Four waves of 20, each fewer than nginx has connections free (so none
# is dropped for want of one): 1 passes (the burst), 32 are held, the
# other 47 refused at once.
my (%answered, @held);
for my $wave (1 .. 4) {
    my ($answers, $open) = main::send_and_wait('/slow.html', 20, 2);
    $answered{$_} += $answers->{$_} for keys %$answers;
    push @held, @$open;
}
Test::More::is(main::status_within('/other.html'), 200, 'another location answers');
Test::More::is(scalar @held, 32, 'half of worker_connections (64) held');
Test::More::is($answered{200}, 1, 'the burst passed');
Test::More::is($answered{429}, 47, 'the rest rejected at once with sluice_status');
Test::More::is(main::status_within('/slow.html'), 429, 'this one refuses at once');
close $_ for @held;
main::held(0) or die 'the holds did not end';
Test::More::is(main::metric('sluice_delay_refused_total'), 48, 'counted as refused holds');
--- request
GET /other.html
--- response_body
other



=== TEST 2: sluice_wait_max sets another cap, above the default as well as below
--- config
location = /slow.html { root html; sluice glacial wait=1h; try_files /other.html =404; sluice_wait_max 40; }
location = /few.html { root html; sluice glacial wait=1h; try_files /other.html =404; sluice_wait_max 2; }
location = /other.html { root html; }
location = /metrics { sluice_metrics; }
--- init
my ($answered, $held) = main::send_and_wait('/slow.html', 30, 2);
my ($more_answered, $more) = main::send_and_wait('/slow.html', 15, 2);
$answered->{429} += $more_answered->{429} // 0;
push @$held, @$more;
Test::More::is(main::status_within('/other.html'), 200, 'another location answers');
Test::More::is(scalar @$held, 40, 'sluice_wait_max 40 holds 40');
Test::More::is($answered->{429}, 4, 'and refuses the rest');
close $_ for @$held;
main::held(0) or die 'the holds did not end';
my ($few, $two) = main::send_and_wait('/few.html', 4, 3);
Test::More::is(scalar @$two, 2, 'sluice_wait_max 2 holds 2');
close $_ for @$two;
--- request
GET /other.html
--- response_body
other
