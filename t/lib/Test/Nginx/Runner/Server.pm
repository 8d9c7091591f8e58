package Test::Nginx::Runner::Server;

# The nginx side of our Test::Nginx::Socket: the server root
# (t/servroot/{conf,html,logs}), the generated nginx.conf, and starting and
# stopping nginx. Nothing here knows about test blocks; Socket.pm passes in
# what each function needs.

use strict;
use warnings;

use Exporter qw(import);
use File::Path qw(make_path remove_tree);
use POSIX qw(WNOHANG SIGKILL SIGQUIT SIGTERM);
use Time::HiRes qw(sleep time);

our @EXPORT_OK = qw(
    setup_server_root
    write_files
    render_config
    run_nginx
    read_pid
    is_running
    stop_nginx
);

# Recreates the server root: removes conf/, html/, logs/ and *_temp dirs
# (never anything else, in case the root points somewhere it should not),
# then creates them again with html/index.html as upstream does.
sub setup_server_root {
    my ($root) = @_;

    if (-d $root) {
        remove_tree("$root/conf", "$root/html", "$root/logs",
            glob("$root/*_temp"), glob("$root/*_cache"));
    }
    make_path("$root/conf", "$root/html", "$root/logs");

    my $index = "$root/html/index.html";
    open my $out, '>', $index or die "cannot write $index: $!\n";
    print $out '<html><head><title>It works!</title></head><body>It works!</body></html>';
    close $out;
}

# Writes [name, body, date] entries; relative names go under $html_dir.
# A date ("YYYYMMDDhhmm") sets the file's mtime (GMT).
sub write_files {
    my ($html_dir, $files) = @_;

    for my $file (@$files) {
        my ($name, $body, $date) = @$file;
        my $path = $name =~ m{^/} ? $name : "$html_dir/$name";
        if ($path =~ m{(.*)/}) {
            make_path($1) unless -d $1;
        }
        open my $out, '>', $path or die "cannot write $path: $!\n";
        binmode $out;
        print $out $body // '';
        close $out;

        if ($date) {
            my @t = $date =~ /^(\d{4})(\d\d)(\d\d)(\d\d)(\d\d)(?:\.(\d\d))?$/
                or die "bad date '$date' for $name: expected YYYYMMDDhhmm[.ss]\n";
            require Time::Local;
            my $epoch = Time::Local::timegm($t[5] // 0, $t[4], $t[3], $t[2], $t[1] - 1, $t[0]);
            utime $epoch, $epoch, $path or die "cannot set the time of $path: $!\n";
        }
    }
}

# The nginx.conf for one block, laid out like upstream's: main settings,
# main_config, http { http_config, server { preamble, config, location / } },
# post_main_config, events. %c holds every piece.
sub render_config {
    my (%c) = @_;

    my $env = join '', map { my $v = /\s/ ? "'$_'" : $_; "env $v;\n" } @{ $c{env} };
    my $root_location = $c{no_root_location} ? '' : <<"_EOC_";
        location / {
            root $c{html_dir};
            index index.html index.htm;
        }
_EOC_
    my $user = $c{user} ? "user $c{user};\n" : '';

    return <<"_EOC_";
worker_processes  $c{workers};
daemon on;
master_process $c{master_process};
error_log $c{error_log} $c{log_level};
pid       $c{pid_file};
$env
$c{main_config}

http {
    access_log $c{access_log};

    default_type text/plain;
    keepalive_timeout  68;

$c{http_config}

    server {
        listen          $c{listen};
        server_name     '$c{server_name}';

        client_max_body_size 30M;

        # Begin preamble config...
$c{preamble}
        # End preamble config...

        # Begin test case config...
$c{config}
        # End test case config.

$root_location    }
}

$c{post_main_config}

events {
    accept_mutex off;
    worker_connections  $c{worker_connections};
}
$user
_EOC_
}

# Runs the nginx command line @cmd (nginx daemonizes, so it returns once
# the configuration is loaded). stdout is discarded, stderr goes to
# $stderr_file. Gives up after $timeout seconds. Returns the wait status
# (-1 when it could not be run) and nginx's stderr.
sub run_nginx {
    my ($cmd, $stderr_file, $timeout) = @_;

    my $pid = fork;
    die "fork failed: $!\n" unless defined $pid;
    if ($pid == 0) {
        open STDOUT, '>', '/dev/null';
        open STDERR, '>', $stderr_file;
        exec { $cmd->[0] } @$cmd or POSIX::_exit(127);
    }

    my $deadline = time + $timeout;
    my $status;
    while (1) {
        my $r = waitpid $pid, WNOHANG;
        if ($r == $pid) { $status = $?; last }
        if (time > $deadline) {
            kill SIGKILL, $pid;
            waitpid $pid, 0;
            $status = -1;
            last;
        }
        sleep 0.01;
    }

    my $stderr = '';
    if (open my $in, '<', $stderr_file) {
        local $/;
        $stderr = <$in> // '';
    }
    $status = -1 if ($status >> 8) == 127 && $stderr eq '';
    return ($status, $stderr);
}

# The pid in $pid_file, or undef.
sub read_pid {
    my ($pid_file) = @_;

    open my $in, '<', $pid_file or return undef;
    my $pid = <$in>;
    close $in;
    return undef unless defined $pid && $pid =~ /^\s*(\d+)\s*$/;
    return $1;
}

# Whether $pid is alive. A daemonized nginx is reparented to PID 1 when it
# exits; where PID 1 is slow to reap, the zombie still answers kill 0, so
# /proc is asked first.
sub is_running {
    my ($pid) = @_;
    return 0 unless $pid && kill 0, $pid;
    if (open my $in, '<', "/proc/$pid/stat") {
        my $stat = <$in> // '';
        return 0 if $stat =~ /^\d+ \(.*\) Z /s;
    }
    return 1;
}

# Stops the nginx whose pid is in $pid_file: QUIT (graceful), then TERM,
# then KILL to its process group, each given part of $timeout. Returns a
# warning message when it had to force it, else undef.
sub stop_nginx {
    my ($pid_file, $timeout) = @_;

    my $pid = read_pid($pid_file);
    unless (is_running($pid)) {
        unlink $pid_file;
        return undef;
    }

    for my $step ([SIGQUIT, $timeout], [SIGTERM, 1]) {
        my ($signal, $wait) = @$step;
        kill $signal, $pid;
        my $deadline = time + $wait;
        while (time < $deadline) {
            return undef unless is_running($pid);
            sleep 0.02;
        }
    }

    # nginx daemonizes with setsid(): its workers share its process group.
    kill SIGKILL, (getpgrp($pid) == $pid ? -$pid : $pid);
    my $deadline = time + 1;
    sleep 0.02 while is_running($pid) && time < $deadline;
    unlink $pid_file;
    return "nginx $pid did not stop on QUIT or TERM; killed it";
}

1;
