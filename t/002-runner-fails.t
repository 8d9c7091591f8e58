# The Test::Nginx runner reports failures: t/fixtures/failing.tt breaks one
# expectation per block, and each must come back as exactly one "not ok".
# Runs the fixture with whichever Test::Nginx::Socket this process loads
# (ours with -I t/lib, else upstream's), in its own server root and port.

use strict;
use warnings;

use File::Temp qw(tempdir);
use IO::Socket::INET ();
use Test::More;

my $fixture = 't/fixtures/failing.tt';

# TEST number => what its one failure says.
my %expected = (
    1  => 'TEST 1: wrong status code - status code ok',
    2  => 'TEST 2: wrong body - response_body - response is expected',
    3  => 'TEST 3: missing response header - header X-Missing ok',
    4  => 'header X-Present not present in the raw headers',
    5  => 'response_body_like - response is expected',
    6  => 'pattern "this line is never logged" should match a line in error.log',
    7  => 'pattern "No such file or directory" should not match any line in error.log',
    8  => 'TEST 8: the second pipelined response has another status - status code ok',
    9  => 'TEST 9: nginx starts although it must die - die as expected',
    10 => 'ERROR: client socket timed out',
);

sub free_port {
    for (1 .. 100) {
        my $port = 20000 + int rand 30000;
        my $sock = IO::Socket::INET->new(
            LocalAddr => '127.0.0.1', LocalPort => $port, Proto => 'tcp', ReuseAddr => 1,
        ) or next;
        close $sock;
        return $port;
    }
    die "no free port\n";
}

my $output = do {
    local $ENV{TEST_NGINX_SERVROOT} = tempdir('sluice-runner-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    local $ENV{TEST_NGINX_SERVER_PORT} = free_port();
    local $ENV{PERL5LIB} = join ':', grep { !ref } @INC;
    delete local $ENV{TEST_NGINX_RANDOMIZE};
    delete local $ENV{TEST_NGINX_PORT};
    delete local $ENV{TEST_NGINX_CLIENT_PORT};
    `"$^X" $fixture 2>&1`;
};
my $status = $?;

my @failed = $output =~ /^not ok \d+ - (.*)$/mg;
my @passed = $output =~ /^ok \d+ - (.*)$/mg;

isnt($status, 0, 'the fixture run exits non-zero');
is(scalar @failed, scalar keys %expected, 'one failure per block, no more')
    or diag $output;
for my $n (sort { $a <=> $b } keys %expected) {
    my @hits = grep { /\bTEST $n:/ } @failed;
    is(scalar @hits, 1, "TEST $n fails once") or diag $output;
    like($hits[0] // '', qr/\Q$expected{$n}\E/, "TEST $n failure says what broke");
}
cmp_ok(scalar @passed, '>=', 8, 'the expectations that hold still pass');
unlike($output, qr/^Bail out!/m, 'the run was not aborted');

done_testing();
