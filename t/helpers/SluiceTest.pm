# Helpers shared by the t/*.t files that need more than one nginx: free
# ports, a real `sluice root` process, HTTP calls to it, and signalling the
# nginx under test. Plain Perl (core modules only), so the files run the
# same under upstream Test::Nginx and under the runner in t/lib.

package SluiceTest;

use strict;
use warnings;

use Exporter 'import';
use File::Temp ();
use HTTP::Tiny;
use IO::Socket::INET;
use JSON::PP ();
use POSIX ':sys_wait_h';
use Time::HiRes qw(sleep time);

our @EXPORT_OK = qw(free_port start_root stop_root root_call nginx_pid
    reload_nginx wait_until http_request load_sluice_module start_nginx
    largest_zone_mib);

# The module under test: $TEST_NGINX_SLUICE_MODULE (make sets it), else
# the one `make module` builds.
require FindBin;
$ENV{TEST_NGINX_SLUICE_MODULE} ||=
    "$FindBin::Bin/../build/nginx/modules/ngx_http_sluice_module.so";

# A block preprocessor: `load_module` of sluice unless the block has its
# own --- main_config.
sub load_sluice_module {
    my ($block) = @_;
    $block->set_value(main_config => "load_module $ENV{TEST_NGINX_SLUICE_MODULE};\n")
        unless defined $block->main_config;
}

# A TCP port nothing listens on right now.
sub free_port {
    my $sock = IO::Socket::INET->new(
        Listen => 1, LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp', ReuseAddr => 1,
    ) or die "cannot find a free port: $!";
    my $port = $sock->sockport;
    close $sock;
    return $port;
}

# The `sluice` binary: $TEST_NGINX_SLUICE_BIN, else the release build.
sub sluice_bin {
    my $bin = $ENV{TEST_NGINX_SLUICE_BIN};
    if (!$bin) {
        require FindBin;
        $bin = "$FindBin::Bin/../target/release/sluice";
    }
    die "sluice binary $bin not found (make bin)\n" unless -x $bin;
    return $bin;
}

# Starts `sluice root` on a free loopback port with a fresh SQLite
# database; returns a handle with {url, pid, dir, port}. Extra flags may be
# given. Waits until /healthz answers.
sub start_root {
    my (%opt) = @_;
    my $dir = $opt{dir} // File::Temp::tempdir(CLEANUP => 1);
    my $port = $opt{port} // free_port();
    my @cmd = (sluice_bin(), 'root', '--listen', "127.0.0.1:$port",
        '--db', "sqlite://$dir/quotas.db", '--reload-interval', $opt{reload} // '100ms',
        @{ $opt{args} // [] });
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>>', "$dir/root.log";
        open STDERR, '>>', "$dir/root.log";
        exec @cmd or POSIX::_exit(127);
    }
    my $root = { url => "http://127.0.0.1:$port", pid => $pid, dir => $dir, port => $port };
    my $http = HTTP::Tiny->new(timeout => 1);
    my $deadline = time + 20;
    while (time < $deadline) {
        my $res = $http->get("$root->{url}/healthz");
        return $root if $res->{status} == 200;
        die "sluice root exited early; see $dir/root.log\n"
            if waitpid($pid, WNOHANG) == $pid;
        sleep 0.05;
    }
    stop_root($root);
    die "sluice root did not answer /healthz within 20 s; see $dir/root.log\n";
}

# Stops a root started by start_root (SIGTERM, then SIGKILL).
sub stop_root {
    my ($root) = @_;
    return unless $root && $root->{pid};
    kill 'TERM', $root->{pid};
    for (1 .. 100) {
        if (waitpid($root->{pid}, WNOHANG) == $root->{pid}) {
            delete $root->{pid};
            return;
        }
        sleep 0.05;
    }
    kill 'KILL', $root->{pid};
    waitpid($root->{pid}, 0);
    delete $root->{pid};
}

# Calls the root's admin API: METHOD, path, optional body (a Perl value
# sent as JSON), with the root's {admin_token} when it has one. Returns
# (status, decoded JSON body or raw text).
sub root_call {
    my ($root, $method, $path, $body) = @_;
    my %args = (headers => { 'Content-Type' => 'application/json' });
    $args{headers}{Authorization} = "Bearer $root->{admin_token}" if $root->{admin_token};
    $args{content} = JSON::PP::encode_json($body) if defined $body;
    my $res = HTTP::Tiny->new(timeout => 5)->request($method, "$root->{url}$path", \%args);
    my $decoded = eval { JSON::PP::decode_json($res->{content}) } // $res->{content};
    return ($res->{status}, $decoded);
}

# One HTTP/1.1 request on a new connection, any headers allowed (Host
# too, which HTTP::Tiny refuses). Returns {status, headers (lowercase
# names), content}.
sub http_request {
    my ($method, $url, $headers, $body) = @_;
    my ($host, $port, $path) = $url =~ m{^http://([^:/]+):(\d+)(/.*)?$}
        or die "bad url $url";
    $path //= '/';
    my %h = (Host => "$host:$port", Connection => 'close', %{ $headers // {} });
    $h{'Content-Length'} = length $body if defined $body;
    my $sock = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port, Timeout => 5)
        or die "connect $url: $!";
    print $sock "$method $path HTTP/1.1\r\n",
        (map { "$_: $h{$_}\r\n" } sort keys %h), "\r\n", $body // '';
    my $raw = do { local $/; <$sock> } // '';
    close $sock;
    my ($head, $content) = split /\r\n\r\n/, $raw, 2;
    my ($status) = $head =~ m{^HTTP/1\.\d (\d{3})} or return { status => 599, headers => {}, content => $raw };
    my %headers;
    for my $line (split /\r\n/, $head) {
        $headers{ lc $1 } = $2 if $line =~ /^([^:]+):\s*(.*)$/;
    }
    if (($headers{'transfer-encoding'} // '') =~ /chunked/i) {
        my $plain = '';
        while ($content =~ s/^([0-9a-fA-F]+)\r\n//) {
            my $n = hex $1;
            last if $n == 0;
            $plain .= substr($content, 0, $n, '');
            $content =~ s/^\r\n//;
        }
        $content = $plain;
    }
    return { status => $status, headers => \%headers, content => $content // '' };
}

# Sends $n requests for $path to nginx on 127.0.0.1:$port, each on a
# connection of its own, without reading the replies: returns the
# sockets, so that the caller keeps the clients there or closes them
# (clients that leave).
sub send_and_keep {
    my ($port, $path, $n) = @_;
    return map {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 10)
            or die "connect: $!";
        print $s "GET $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        $s;
    } 1 .. $n;
}

# One series of the Prometheus text nginx on 127.0.0.1:$port serves at
# $path, as a number (undef when absent).
sub metric_value {
    my ($port, $path, $name) = @_;
    my $text = http_request('GET', "http://127.0.0.1:$port$path")->{content};
    return $text =~ /^\Q$name\E (\S+)$/m ? $1 + 0 : undef;
}

# Starts our nginx with the sluice module in a scratch prefix: the
# `http { }` block is $opt{http}; $opt{files} maps paths under html/ to
# their content. Returns {prefix, stop}; stop it before the roots it
# syncs with.
sub start_nginx {
    my (%opt) = @_;
    require FindBin;
    my $nginx = $ENV{TEST_NGINX_BINARY} || "$FindBin::Bin/../build/nginx/sbin/nginx";
    my $prefix = File::Temp::tempdir(CLEANUP => 1);
    # Workers run as an unprivileged user when nginx starts as root.
    chmod 0755, $prefix;
    mkdir "$prefix/$_", 0755 for qw(conf logs html);
    for my $path (sort keys %{ $opt{files} // {} }) {
        my $file = "$prefix/html/$path";
        (my $dir = $file) =~ s{/[^/]+$}{};
        system('mkdir', '-p', $dir) == 0 or die "mkdir $dir";
        open my $fh, '>', $file or die "$file: $!";
        print $fh $opt{files}{$path};
        close $fh;
    }
    system('chmod', '-R', 'a+rX', "$prefix/html") == 0 or die 'chmod';
    open my $fh, '>', "$prefix/conf/nginx.conf" or die $!;
    print $fh "load_module $ENV{TEST_NGINX_SLUICE_MODULE};\n",
        "worker_processes 1;\nerror_log $prefix/logs/error.log info;\npid $prefix/logs/nginx.pid;\n",
        "events { worker_connections 256; }\n",
        "http {\n    access_log off;\n$opt{http}\n}\n";
    close $fh;
    my @cmd = ($nginx, '-p', "$prefix/", '-c', "$prefix/conf/nginx.conf");
    system(@cmd) == 0 or die "nginx did not start; see $prefix/logs/error.log\n";
    return { prefix => $prefix, stop => sub { system(@cmd, '-s', 'stop'); sleep 0.3 } };
}

# The largest `sluice_zone` in megabytes, as `nginx -t` names it when
# refusing a larger one (it depends on the table layout, so a test asks
# nginx instead of repeating the arithmetic).
my $largest_zone_mib;
sub largest_zone_mib {
    return $largest_zone_mib if defined $largest_zone_mib;
    require FindBin;
    my $nginx = $ENV{TEST_NGINX_BINARY} || "$FindBin::Bin/../build/nginx/sbin/nginx";
    my $prefix = File::Temp::tempdir(CLEANUP => 1);
    mkdir "$prefix/$_" for qw(conf logs);
    open my $fh, '>', "$prefix/conf/nginx.conf" or die $!;
    print $fh "load_module $ENV{TEST_NGINX_SLUICE_MODULE};\n",
        "error_log $prefix/logs/error.log;\npid $prefix/logs/nginx.pid;\n",
        "events {}\nhttp { sluice_zone 100g; }\n";
    close $fh;
    my $out = qx{"$nginx" -t -p "$prefix/" -c "$prefix/conf/nginx.conf" 2>&1};
    ($largest_zone_mib) = $out =~ /the largest quota table fits in (\d+)m/
        or die "nginx -t did not name the largest zone:\n$out";
    return $largest_zone_mib;
}

# The pid of the nginx master whose server root is $servroot.
sub nginx_pid {
    my ($servroot) = @_;
    open my $fh, '<', "$servroot/logs/nginx.pid" or die "no nginx pid file: $!";
    my $pid = <$fh>;
    chomp $pid;
    return $pid;
}

# `nginx -s reload`, then waits for the new workers.
sub reload_nginx {
    my ($servroot, $settle) = @_;
    kill 'HUP', nginx_pid($servroot) or die "cannot signal nginx: $!";
    sleep($settle // 1.5);
}

# Polls $cond every 50 ms until it is true or $timeout seconds pass;
# returns whether it became true.
sub wait_until {
    my ($cond, $timeout) = @_;
    my $deadline = time + $timeout;
    while (time < $deadline) {
        return 1 if $cond->();
        sleep 0.05;
    }
    return $cond->() ? 1 : 0;
}

1;
