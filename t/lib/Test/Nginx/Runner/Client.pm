package Test::Nginx::Runner::Client;

# The HTTP side of our Test::Nginx::Socket: turns the request sections of a
# test block into bytes, sends them over a plain TCP socket and splits what
# comes back into responses. It builds requests the way upstream
# Test::Nginx::Socket does (request line defaults, Host and Connection
# headers, Content-Length from the trimmed body) so that a .t file gets the
# same requests under either runner.

use strict;
use warnings;

use Errno qw(EAGAIN EINTR EWOULDBLOCK ECONNREFUSED);
use Exporter qw(import);
use HTTP::Response ();
use IO::Select ();
use IO::Socket::INET ();
use Time::HiRes qw(sleep);

our @EXPORT_OK = qw(
    parse_more_headers
    build_request
    send_request
    parse_response
);

# Parses a "--- more_headers" text: one "Name: value" per line, lines
# starting with "#" ignored. Returns the headers as CRLF-terminated lines
# and whether they ask for a chunked request body.
sub parse_more_headers {
    my ($text) = @_;

    my ($out, $chunked) = ('', 0);
    for my $line (split /\n+/, $text // '') {
        next if $line =~ /^\s*#/;
        my ($key, $val) = split /:\s*/, $line, 2;
        $val //= '';
        $chunked = 1 if lc($key) eq 'transfer-encoding' && $val eq 'chunked';
        $out .= "$key: $val\r\n";
    }
    return ($out, $chunked);
}

# Builds the bytes of one request from a "--- request" style text:
# "METHOD [URI [VERSION]]" on the first line (URI defaults to "/", VERSION
# to HTTP/1.1), the rest is the body. Options:
#   more_headers  CRLF-terminated header lines (see parse_more_headers)
#   chunked       the body is already chunked: send it as is
#   connection    value of the Connection header unless more_headers has one
#   host          value of the Host header unless more_headers has one
# Dies with a message when the request line is empty.
sub build_request {
    my ($text, %opt) = @_;

    my $more = $opt{more_headers} // '';
    $text //= '';

    my ($line, $body) = $text =~ /\A([^\n]*)(?:\n(.*))?\z/s;
    my ($method, $uri, $version) = split ' ', $line // '';
    die "Request line should be non-empty\n" unless defined $method;
    $uri //= '/';
    $version //= 'HTTP/1.1';

    my $len_header = '';
    if (!$opt{chunked} && defined $body && $body ne ''
        && $more !~ /(?:^|\n)Content-Length:/)
    {
        $body =~ s/^\s+|\s+$//gs;
        $len_header = 'Content-Length: ' . length($body) . "\r\n";
    }
    $body //= '';

    $more =~ s/(?<!\r)\n/\r\n/gs;

    my $headers = '';
    $headers .= "Host: $opt{host}\r\n" if $more !~ /(?:^|\n)Host:/msi;
    $headers .= "Connection: $opt{connection}\r\n"
        if $more !~ /(?:^|\n)Connection/msi;

    return "$method $uri $version\r\n$headers$more$len_header\r\n$body";
}

# Sends $data to $addr:$port and reads until the server closes the
# connection. $timeout bounds every wait (connect, each read or write), so a
# silent server cannot hang the suite. Returns (response bytes, error):
# error is undef on success, "timeout" when a wait ran out (the bytes read
# so far are returned), or a message when no connection could be made.
sub send_request {
    my ($addr, $port, $data, $timeout) = @_;

    # nginx was just started: a refused connection is retried briefly.
    my $sock;
    for my $try (1 .. 30) {
        $sock = IO::Socket::INET->new(
            PeerAddr => $addr,
            PeerPort => $port,
            Proto    => 'tcp',
            Timeout  => $timeout,
        );
        last if $sock;
        my $err = "$!";
        return (undef, "cannot connect to $addr:$port: $err")
            unless $!{ECONNREFUSED} && $try < 30;
        sleep 0.02 * $try;
    }

    local $SIG{PIPE} = 'IGNORE';
    $sock->blocking(0);

    my $resp = '';
    my $off = 0;
    my $readers = IO::Select->new($sock);
    my $writers = IO::Select->new($sock);

    while ($readers->count) {
        my ($can_read, $can_write) = IO::Select->select(
            $readers, $off < length $data ? $writers : undef, undef, $timeout);
        if (!$can_read && !$can_write) {
            next if $!{EINTR};
            close $sock;
            return ($resp, 'timeout');
        }

        if ($can_write && @$can_write) {
            my $n = syswrite($sock, $data, length($data) - $off, $off);
            if (defined $n) {
                $off += $n;
            } elsif (!$!{EAGAIN} && !$!{EWOULDBLOCK} && !$!{EINTR}) {
                # The server closed early (for example after an error
                # response): stop writing, still read what it sent.
                $off = length $data;
            }
        }

        if ($can_read && @$can_read) {
            my $n = sysread($sock, my $buf, 16384);
            if (!defined $n) {
                next if $!{EAGAIN} || $!{EWOULDBLOCK} || $!{EINTR};
                last;    # reset by peer: the response ends here
            }
            last if $n == 0;
            $resp .= $buf;
        }
    }

    close $sock;
    return ($resp, undef);
}

# Splits the first response off $raw. Returns (HTTP::Response or undef, the
# status line and headers as received, the bytes after this response,
# error). Bodies are delimited by Content-Length or decoded from chunked
# encoding; without either the body is everything that follows.
sub parse_response {
    my ($raw, $head_req) = @_;

    my $raw_headers = $raw =~ /\A(.*?\r\n)\r\n/s ? $1 : '';
    my $res = HTTP::Response->parse($raw);

    my $code = $res->code;
    if (defined $code && $code !~ /^\d+$/) {
        $res->code(undef);
        $code = undef;
    }

    return ($res, $raw_headers, undef, undef)
        if $code && ($code == 304 || $code == 101);

    my $left;
    if ($head_req) {
        # A response to HEAD has no body whatever its headers say.
        $left = $res->content if length($res->content // '');
        $res->content('');
        return ($res, $raw_headers, $left, undef);
    }

    my $te = $res->header('Transfer-Encoding');
    my $len = $res->header('Content-Length');
    my $body = $res->content // '';

    if (defined $te && $te eq 'chunked') {
        my $decoded = '';
        pos($body) = 0;
        while (1) {
            if ($body =~ /\G0[ \t]*\r\n\r\n/gc) {
                $left = substr $body, pos $body if pos($body) < length $body;
                last;
            }
            if ($body =~ /\G[ \t]*([A-Fa-f0-9]+)[ \t]*\r\n/gc) {
                my $size = hex $1;
                my $start = pos $body;
                return ($res, $raw_headers, undef,
                    'invalid chunked data received (not enough octets for the data section)')
                    if $start + $size > length $body;
                $decoded .= substr $body, $start, $size;
                pos($body) = $start + $size;
                return ($res, $raw_headers, undef,
                    'invalid chunked data received (expected CRLF)')
                    unless $body =~ /\G\r\n/gc;
                next;
            }
            return ($res, $raw_headers, undef,
                $body =~ /\G./gcs ? 'invalid chunked body received'
                                  : 'no last chunk found');
        }
        $res->content($decoded);

    } elsif (defined $len && $len =~ /^\d+$/ && length($body) > $len) {
        $left = substr $body, $len;
        $res->content(substr $body, 0, $len);
    }

    return ($res, $raw_headers, $left, undef);
}

1;
