package Test::Nginx::Socket;

# sluice's own implementation of the subset of Test::Nginx::Socket
# (openresty/test-nginx) that our suites use, written from scratch so that
# `make test` needs nothing outside Debian's packages. A .t file in the
# standard format runs unchanged under this module and under upstream's;
# t/README.md lists the supported sections, functions and environment
# variables. Anything outside the subset stops the run with a message
# instead of being ignored.
#
# Like upstream, this is a Test::Base subclass: Test::Base parses the
# __DATA__ blocks and applies section filters (`eval`, `chomp`, ...);
# `use Test::Nginx::Socket 'no_plan'` or `tests => N` declares the plan.
# Per block: stop the previous nginx, recreate t/servroot, write
# conf/nginx.conf, start nginx, run --- init, send the requests
# (repeat_each times) and check the responses and the logs.

use v5.10.1;
use strict;
use warnings;

use Test::Base -base;

use Cwd ();
use File::Path qw(remove_tree);
use File::Spec ();
use IO::Socket::INET ();
use List::Util qw(min shuffle);
use Scalar::Util qw(looks_like_number);
use Test::LongString ();
use Time::HiRes qw(sleep);

use Test::Nginx::Runner::Client qw(
    parse_more_headers build_request send_request parse_response
);
use Test::Nginx::Runner::Server qw(
    setup_server_root write_files render_config run_nginx read_pid
    is_running stop_nginx
);

our $VERSION = '0.1';

our @EXPORT = qw(
    run_tests run_test
    repeat_each workers worker_connections master_on master_off
    master_process_enabled log_level no_shuffle no_root_location
    no_long_string env_to_nginx timeout config_preamble
    check_accum_error_log add_block_preprocessor add_cleanup_handler
    server_name server_addr server_port server_port_for_client
    server_root html_dir bail_out is_str
);

# ---------------------------------------------------------------------------
# Settings: the same environment variables and defaults as upstream.

our $Verbose              = $ENV{TEST_NGINX_VERBOSE};
our $NginxBinary          = $ENV{TEST_NGINX_BINARY} || 'nginx';
our $ServerAddr           = '127.0.0.1';
our $ServerName           = 'localhost';
our $ServerPort           = $ENV{TEST_NGINX_SERVER_PORT} || $ENV{TEST_NGINX_PORT} || 1984;
our $ServerPortForClient  = $ENV{TEST_NGINX_CLIENT_PORT} || $ServerPort;
our $Randomize            = $ENV{TEST_NGINX_RANDOMIZE};
our $Workers              = 1;
our $WorkerConnections    = 64;
our $LogLevel             = $ENV{TEST_NGINX_LOG_LEVEL} || 'debug';
our $MasterProcessEnabled = $ENV{TEST_NGINX_MASTER_PROCESS} || 'off';
our $Timeout              = $ENV{TEST_NGINX_TIMEOUT} || 3;
our $TestNginxSleep       = $ENV{TEST_NGINX_SLEEP} || 0.015;
our $NoShuffle            = $ENV{TEST_NGINX_NO_SHUFFLE} || 0;
our $LoadModules          = $ENV{TEST_NGINX_LOAD_MODULES};
our $CheckAccumErrLog     = $ENV{TEST_NGINX_CHECK_ACCUM_ERR_LOG};
our $RepeatEach           = 1;
our $NoRootLocation       = 0;
our $NoLongString         = 0;
our $ConfigPreamble       = '';
our @EnvToNginx;
our @BlockPreprocessors;
our @CleanupHandlers;

if ($Randomize) {
    $ServerPort = free_port({}) // die "Cannot find a free port to listen on\n";
    $ServerPortForClient = $ServerPort;
}

our $ServRoot = $Randomize
    ? File::Spec->rel2abs("t/servroot_$ServerPort")
    : ($ENV{TEST_NGINX_SERVROOT} || File::Spec->rel2abs('t/servroot'));
$ENV{TEST_NGINX_SERVER_ROOT} = $ServRoot;

our $LogDir     = "$ServRoot/logs";
our $ErrLogFile = "$LogDir/error.log";
our $AccLogFile = "$LogDir/access.log";
our $HtmlDir    = "$ServRoot/html";
our $ConfDir    = "$ServRoot/conf";
our $ConfFile   = "$ConfDir/nginx.conf";
our $PidFile    = "$LogDir/nginx.pid";

# Run state.
my $PrevConfig;         # config nginx is running with (undef: none)
my $ErrLogFilePos = 0;  # where the next error-log check starts reading
my $ConnectFailures = 0;
my $MainPid = $$;       # END must not clean up in forked children

# Sections this runner understands; any other stops the run.
my %Supported = map { $_ => 1 } qw(
    ONLY SKIP LAST
    main_config http_config config post_main_config server_name log_level
    user_files init wait timeout must_die
    request raw_request pipelined_requests more_headers ignore_response
    error_code error_code_like
    response_body response_body_like response_body_unlike
    response_headers response_headers_like
    raw_response_headers_like raw_response_headers_unlike
    error_log no_error_log grep_error_log grep_error_log_out
    access_log no_access_log
);

# ---------------------------------------------------------------------------
# Functions the .t files call.

sub repeat_each { $RepeatEach = shift if @_; return $RepeatEach }
sub workers { $Workers = shift if @_; return $Workers }
sub worker_connections { $WorkerConnections = shift if @_; return $WorkerConnections }
sub master_on { $MasterProcessEnabled = 'on' }
sub master_off { $MasterProcessEnabled = 'off' }

sub master_process_enabled {
    $MasterProcessEnabled = shift() ? 'on' : 'off' if @_;
    return $MasterProcessEnabled;
}

sub log_level { $LogLevel = shift if @_; return $LogLevel }
sub no_shuffle { $NoShuffle = 1 }
sub no_root_location { $NoRootLocation = 1 }
sub no_long_string { $NoLongString = 1 }
sub timeout { $Timeout = shift if @_; return $Timeout }
sub config_preamble { $ConfigPreamble = shift }
sub check_accum_error_log { $CheckAccumErrLog = 1 }
sub add_block_preprocessor { unshift @BlockPreprocessors, shift }
sub add_cleanup_handler { unshift @CleanupHandlers, shift }
sub server_name { $ServerName = shift if @_; return $ServerName }
sub server_addr { $ServerAddr = shift if @_; return $ServerAddr }
sub server_port { $ServerPort = shift if @_; return $ServerPort }
sub server_port_for_client { $ServerPortForClient = shift if @_; return $ServerPortForClient }
sub server_root { return $ServRoot }
sub html_dir { return $HtmlDir }

sub env_to_nginx {
    die "env_to_nginx: no arguments specified\n" unless @_;
    for my $v (@_) {
        die "env_to_nginx: bad argument value: $v\n" if $v !~ /^[A-Za-z_]/ || $v =~ /\n/;
        push @EnvToNginx, $v;
    }
}

# Compares like upstream: a Regexp expectation is a match, a string an
# equality (with a readable diff for long strings unless no_long_string).
sub is_str {
    my ($got, $expected, $desc) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    return Test::More::like($got, $expected, $desc) if ref $expected eq 'Regexp';
    return Test::More::is($got, $expected, $desc) if $NoLongString;
    return Test::LongString::is_string($got, $expected, $desc);
}

sub bail_out {
    cleanup();
    Test::More::BAIL_OUT(join '', @_);
}

sub run_tests {
    check_nginx_binary();
    $ENV{TEST_NGINX_SERVER_PORT} //= $ServerPort;

    my @blocks = Test::Base::blocks();
    @blocks = shuffle @blocks unless $NoShuffle;
    for my $block (@blocks) {
        $_->($block) for @BlockPreprocessors;
        $block->set_value(name => "$0 " . $block->name);
        run_test($block);
    }

    cleanup();
}

# ---------------------------------------------------------------------------
# One block.

sub run_test {
    my ($block) = @_;
    my $name = $block->name;

    for my $section (@{ $block->_section_order // [] }) {
        next if $Supported{$section};
        bail_out("$name - section '--- $section' is not supported by the "
            . "Test::Nginx runner in t/lib (see t/README.md); use upstream "
            . "Test::Nginx or extend t/lib");
    }

    my $rand_ports = {};
    my $config = expand_env(scalar($block->config), $name, $rand_ports);
    local $LogLevel = $block->log_level || $LogLevel;

    if (defined $block->must_die) {
        run_must_die($block, $config // '', $rand_ports);
        return;
    }

    if (defined $config) {
        start_server($block, $config, $rand_ports);
        $PrevConfig = $config;
    } elsif (!defined $PrevConfig) {
        bail_out("$name - No '--- config' section specified and could not get previous one");
    }

    if (my $init = $block->init) {
        eval $init;
        bail_out("$name - init failed: $@") if $@;
    }

    $ErrLogFilePos = 0;
    for my $i (1 .. $RepeatEach) {
        write_user_files($block, $rand_ports) if $i > 1;
        run_requests($block, $i - 1);
    }
}

# Stops whatever nginx runs on our server root, lays the root out afresh
# and starts nginx with the block's configuration. Bails out when nginx
# does not start: every later check would be meaningless.
sub start_server {
    my ($block, $config, $rand_ports) = @_;
    my $name = $block->name;

    prepare($block, $config, $rand_ports);
    my ($status, $stderr) = exec_nginx();
    if ($status != 0) {
        my $why = $status == -1
            ? "could not run $NginxBinary (or it hung)"
            : 'exit status ' . ($status >> 8);
        bail_out("$name - nginx failed to start ($why):\n$stderr"
            . "conf: $ConfFile\nerror log: $ErrLogFile\n");
    }

    # The daemon writes its pid file just after detaching.
    for (1 .. 100) {
        last if defined read_pid($PidFile);
        sleep 0.01;
    }
    bail_out("$name - nginx started but wrote no pid file $PidFile")
        unless defined read_pid($PidFile);
    sleep $TestNginxSleep;
}

# Stops any running nginx, then writes the server root and config for the
# block.
sub prepare {
    my ($block, $config, $rand_ports) = @_;

    stop_running_nginx($block->name);
    eval { setup_server_root($ServRoot); 1 }
        or bail_out($block->name . " - cannot set up $ServRoot: $@");
    write_user_files($block, $rand_ports);
    write_config($block, $config, $rand_ports);
}

# Runs the nginx command line once. Returns its wait status and stderr.
sub exec_nginx {
    warn "starting nginx: $NginxBinary -p $ServRoot/ -c $ConfFile\n" if $Verbose;
    return run_nginx([$NginxBinary, '-p', "$ServRoot/", '-c', $ConfFile],
        "$LogDir/nginx.stderr", 30);
}

# --- must_die: nginx is expected to refuse the configuration.
sub run_must_die {
    my ($block, $config, $rand_ports) = @_;
    my $name = $block->name;
    my $must_die = $block->must_die;

    undef $PrevConfig;
    prepare($block, $config, $rand_ports);
    $ErrLogFilePos = 0;
    for my $i (0 .. $RepeatEach - 1) {
        my ($status) = exec_nginx();
        my $exit_code = $status >> 8;

        if ($status == -1) {
            Test::More::fail("$name - failed to execute the nginx command line");
        } elsif ($status & 127) {
            Test::More::fail("$name - nginx was killed by signal " . ($status & 127));
        } elsif (looks_like_number($must_die)) {
            Test::More::is($exit_code, $must_die, "$name - die with the expected exit code");
        } else {
            Test::More::isnt($status, 0, "$name - die as expected");
        }

        check_error_log($block, $i, 0);

        if ($status == 0) {
            warn "WARNING: $name - nginx must die but it does not; killing it\n";
            for (1 .. 100) { last if defined read_pid($PidFile); sleep 0.01 }
            stop_running_nginx($name);
        }
    }
}

sub stop_running_nginx {
    my ($name) = @_;
    my $warning = stop_nginx($PidFile, $Timeout);
    warn "WARNING: $name - $warning\n" if $warning;
}

sub write_user_files {
    my ($block, $rand_ports) = @_;
    my $name = $block->name;

    my $files = $block->user_files;
    return unless $files;

    if (!ref $files) {
        my @list;
        for my $line (split /^/, $files) {
            if ($line =~ /^>>> (\S+)(?:\s+(.+))?/) {
                push @list, [$1, undef, $2];
            } elsif (@list) {
                $list[-1][1] .= $line;
            }
        }
        $files = \@list;
    } elsif (ref $files ne 'ARRAY') {
        bail_out("$name - --- user_files must be text or an ARRAY, not " . ref $files);
    }

    my @expanded = map {
        [$_->[0], expand_env($_->[1] // '', $name, $rand_ports), $_->[2]]
    } @$files;
    eval { write_files($HtmlDir, \@expanded); 1 }
        or bail_out("$name - cannot write --- user_files: $@");
}

sub write_config {
    my ($block, $config, $rand_ports) = @_;
    my $name = $block->name;

    my $main_config = $block->main_config // '';
    if ($LoadModules) {
        $main_config .= join '', map { "load_module $_;\n" } grep { $_ } split /\s+/, $LoadModules;
    }

    my $text = render_config(
        workers            => $Workers,
        master_process     => $MasterProcessEnabled,
        error_log          => $ErrLogFile,
        log_level          => $LogLevel,
        pid_file           => $PidFile,
        env                => \@EnvToNginx,
        main_config        => expand_env($main_config, $name, $rand_ports),
        access_log         => $AccLogFile,
        http_config        => expand_env($block->http_config // '', $name, $rand_ports),
        listen             => "$ServerAddr:$ServerPort",
        server_name        => $block->server_name // $ServerName,
        preamble           => $ConfigPreamble,
        config             => $config,
        no_root_location   => $NoRootLocation,
        html_dir           => $HtmlDir,
        post_main_config   => expand_env($block->post_main_config // '', $name, $rand_ports),
        worker_connections => $WorkerConnections,
        # Workers would run as nobody and could not read the server root.
        user               => $> == 0 ? 'root' : undef,
    );

    open my $out, '>', $ConfFile or bail_out("$name - cannot write $ConfFile: $!");
    print $out $text;
    close $out;
}

# Replaces $TEST_NGINX_* with the environment's value, and
# $TEST_NGINX_RAND_PORT_<n> with a free port (the same one within a block).
sub expand_env {
    my ($text, $name, $rand_ports) = @_;
    return undef unless defined $text;

    $text =~ s{\$(TEST_NGINX_[_A-Z0-9]+)}{
        my $var = $1;
        if ($var =~ /^TEST_NGINX_RAND_PORT_\d+$/) {
            $rand_ports->{$var} //= free_port({ $ServerPort => 1, map { $_ => 1 } grep { defined } values %$rand_ports })
                // bail_out("$name - cannot find a free port for $var");
        } else {
            bail_out("$name - No environment $var defined.") unless defined $ENV{$var};
            $ENV{$var};
        }
    }ge;
    return $text;
}

# ---------------------------------------------------------------------------
# Requests and response checks.

# The requests of a block, one string per connection.
sub requests_of {
    my ($block) = @_;
    my $name = $block->name;

    my $raw = $block->raw_request;
    if (defined $raw) {
        return [ref $raw eq 'ARRAY' ? join('', @$raw) : $raw];
    }

    my $more = $block->more_headers // '';
    my $headers_for = sub {
        my ($i) = @_;
        return parse_more_headers($more) unless ref $more eq 'ARRAY';
        my $h = $more->[$i];
        bail_out("$name - --- more_headers lacks data for request $i") unless defined $h;
        return parse_more_headers($h);
    };
    my $build = sub {
        my ($text, $i, $connection) = @_;
        my ($headers, $chunked) = $headers_for->($i);
        my $req = eval {
            build_request($text, more_headers => $headers, chunked => $chunked,
                connection => $connection, host => $ServerName);
        };
        bail_out("$name - $@") unless defined $req;
        return $req;
    };

    if (my $pipelined = $block->pipelined_requests) {
        bail_out("$name - --- pipelined_requests must be an ARRAY (use 'eval')")
            unless ref $pipelined eq 'ARRAY';
        my $all = '';
        for my $i (0 .. $#$pipelined) {
            $all .= $build->($pipelined->[$i], $i, $i == $#$pipelined ? 'close' : 'keep-alive');
        }
        return [$all];
    }

    my $request = $block->request;
    bail_out("$name - no --- request, --- raw_request or --- pipelined_requests")
        unless defined $request;
    if (ref $request eq 'ARRAY') {
        return [map { $build->($request->[$_], $_, 'close') } 0 .. $#$request];
    }
    bail_out("$name - --- request must be text or an ARRAY of texts") if ref $request;
    # Leading blank and comment lines are not part of the request.
    1 while $request =~ s/^\s*#[^\n]+\s+|^\s+//gs;
    return [$build->($request, 0, 'close')];
}

sub run_requests {
    my ($block, $repeat_idx) = @_;
    my $name = $block->name;

    my $requests = requests_of($block);
    my $timeout = parse_time(scalar($block->timeout)) // $Timeout;
    my $pipelined = $block->pipelined_requests;
    my $need_array = $pipelined ? 1 : @$requests > 1;
    my $ignore = defined $block->ignore_response;

    my $idx = 0;    # which response, across connections and pipelining
    for my $c (0 .. $#$requests) {
        my $req = $requests->[$c];
        my ($raw, $err) = send_request($ServerAddr, $ServerPortForClient, $req, $timeout);
        if (defined $err) {
            if ($err eq 'timeout') {
                Test::More::fail("ERROR: client socket timed out - $name");
            } else {
                Test::More::fail("$name - $err");
                bail_out("$name - $err (aborted)") if ++$ConnectFailures >= 3;
            }
        }
        $raw //= '';

        my $head_req = $req =~ /^\s*HEAD\s+/ ? 1 : 0;
        my $count = $pipelined ? scalar @$pipelined : 1;
        for my $k (1 .. $count) {
            unless ($ignore) {
                my ($res, $raw_headers, $left, $perr) = parse_response($raw, $head_req);
                Test::More::fail("$name - $perr") if $perr;
                if ($k < $count) {
                    $raw = $left // '';
                } elsif (defined $left && length $left && !$pipelined) {
                    (my $shown = $left) =~ s/([\0-\037\200-\377])/sprintf('\\x{%02x}', ord $1)/eg;
                    warn "WARNING: $name - unexpected extra bytes after the response: \"$shown\"\n";
                }

                check_error_code($block, $res, $idx, $need_array);
                check_raw_response_headers($block, $raw_headers, $idx, $need_array);
                check_response_headers($block, $res, $raw_headers, $idx, $need_array);
                check_response_body($block, $res, $idx, $repeat_idx, $need_array);
            }

            if ($k < $count || $c < $#$requests) {
                sleep $block->wait if $block->wait;
                check_error_log($block, $repeat_idx, $need_array);
                check_access_log($block, $repeat_idx) unless $ignore;
            }
            $idx++;
        }
    }

    sleep $block->wait if $block->wait;
    check_error_log($block, $repeat_idx, $need_array);
    check_access_log($block, $repeat_idx) unless $ignore;
}

# The expectation for response $idx: an ARRAY is indexed when there are
# several responses; a plain value is only allowed for a single response.
sub indexed {
    my ($name, $value, $idx, $need_array) = @_;
    if ($need_array) {
        return $value->[$idx] if ref $value eq 'ARRAY';
        bail_out("$name - You asked for many requests, the expected results should be arrays as well.");
    }
    return ref $value eq 'ARRAY' ? $value->[0] : $value;
}

sub check_error_code {
    my ($block, $res, $idx, $need_array) = @_;
    my $name = $block->name;
    my $code = ($res && $res->code) || '';

    if (defined $block->error_code_like) {
        my $pat = indexed($name, scalar($block->error_code_like), $idx, $need_array);
        Test::More::like($code, qr/$pat/sm, "$name - status code ok");
    } elsif (defined $block->error_code) {
        Test::More::is($code, indexed($name, scalar($block->error_code), $idx, $need_array),
            "$name - status code ok");
    } else {
        Test::More::is($code, 200, "$name - status code ok");
    }
}

sub check_raw_response_headers {
    my ($block, $raw_headers, $idx, $need_array) = @_;
    my $name = $block->name;

    if (defined $block->raw_response_headers_like) {
        my $pat = indexed($name, scalar($block->raw_response_headers_like), $idx, $need_array);
        Test::More::like($raw_headers, qr/$pat/s, "$name - raw resp headers like");
    }
    if (defined $block->raw_response_headers_unlike) {
        my $pat = indexed($name, scalar($block->raw_response_headers_unlike), $idx, $need_array);
        Test::More::unlike($raw_headers, qr/$pat/s, "$name - raw resp headers unlike");
    }
}

# "Name: value" lines; "!Name" means the header must be absent.
sub parse_header_lines {
    my ($text) = @_;
    my @out;
    for my $line (split /\n/, $text // '') {
        $line =~ s/^\s+|\s+$//g;
        next if $line eq '';
        if ($line =~ s/^!\s*//) {
            push @out, [$line, undef];
        } else {
            push @out, [split /\s*:\s*/, $line, 2];
        }
    }
    return @out;
}

sub check_response_headers {
    my ($block, $res, $raw_headers, $idx, $need_array) = @_;
    my $name = $block->name;

    if (defined $block->response_headers) {
        for my $h (parse_header_lines(indexed($name, scalar($block->response_headers), $idx, $need_array))) {
            my ($key, $val) = @$h;
            if (!defined $val) {
                Test::More::unlike($raw_headers, qr/^\s*\Q$key\E\s*:/ms,
                    "$name - header $key not present in the raw headers");
                next;
            }
            $val =~ s/\$ServerPort\b/$ServerPort/g;
            $val =~ s/\$ServerPortForClient\b/$ServerPortForClient/g;
            my $got = $res ? $res->header($key) : undef;
            Test::More::is($got // '', $val, "$name - header $key ok");
        }
    } elsif (defined $block->response_headers_like) {
        for my $h (parse_header_lines(indexed($name, scalar($block->response_headers_like), $idx, $need_array))) {
            my ($key, $pat) = @$h;
            my $got = $res ? $res->header($key) : undef;
            Test::More::like($got // '', qr/^$pat$/, "$name - header $key like ok");
        }
    }
}

sub check_response_body {
    my ($block, $res, $idx, $repeat_idx, $need_array) = @_;
    my $name = $block->name;
    my $content = $res ? $res->content : undef;

    if (defined $block->response_body) {
        my $expected = indexed($name, scalar($block->response_body), $idx, $need_array);
        if (defined $expected && !ref $expected) {
            $expected =~ s/\$ServerPort\b/$ServerPort/g;
            $expected =~ s/\$ServerPortForClient\b/$ServerPortForClient/g;
        }
        is_str($content, $expected,
            "$name - response_body - response is expected (repeated req $repeat_idx, req $idx)");

    } elsif (defined $block->response_body_like || defined $block->response_body_unlike) {
        my $like = defined $block->response_body_like;
        my $value = $like ? $block->response_body_like : $block->response_body_unlike;
        my $pat = indexed($name, $value, $idx, $need_array);
        $pat =~ s/\$ServerPort\b/$ServerPort/g;
        $pat =~ s/\$ServerPortForClient\b/$ServerPortForClient/g;
        my $summary = $content // '';
        $summary =~ s/^\s+|\s+$//g;
        $summary =~ s/\s+/ /g;
        if ($like) {
            Test::More::like($content, qr/$pat/s,
                "$name - response_body_like - response is expected ($summary)");
        } else {
            Test::More::unlike($content, qr/$pat/s,
                "$name - response_body_unlike - response is expected ($summary)");
        }
    }
}

# ---------------------------------------------------------------------------
# Log checks.

# Lines of the error log written since the previous check (all of them with
# check_accum_error_log). Waits a little first: nginx logs some things
# after it has sent the response.
sub error_log_lines {
    sleep $TestNginxSleep * 3;
    open my $in, '<', $ErrLogFile or return [];
    seek $in, $ErrLogFilePos, 0 if !$CheckAccumErrLog && $ErrLogFilePos > 0;
    my @lines = <$in>;
    $ErrLogFilePos = tell $in unless $CheckAccumErrLog;
    close $in;
    return \@lines;
}

sub access_log_lines {
    sleep $TestNginxSleep * 3;
    open my $in, '<', $AccLogFile or return [];
    my @lines = <$in>;
    close $in;
    return \@lines;
}

# A --- error_log style value as a list of patterns: text is one literal
# substring per line; eval may give a Regexp or an ARRAY of both kinds.
sub patterns_of {
    my ($value) = @_;
    if (!ref $value) {
        chomp $value;
        return [split /\n+/, $value];
    }
    return [$value] if ref $value eq 'Regexp';
    return [@$value];
}

sub line_matches {
    my ($line, $pat) = @_;
    return ref $pat ? $line =~ /$pat/ : index($line, $pat) >= 0;
}

sub printable {
    my ($s) = @_;
    chomp $s;
    $s =~ s/"/\\"/g;
    $s =~ s/\r/\\r/g;
    $s =~ s/\n/\\n/g;
    return $s;
}

# One test per pattern: it must match at least one line.
sub expect_lines {
    my ($name, $what, $lines, $value, $repeat_idx) = @_;
    for my $pat (@{ patterns_of($value) }) {
        my $found = grep { line_matches($_, $pat) } @$lines;
        my $p = printable("$pat");
        if ($found) {
            Test::More::pass("$name - pattern \"$p\" matches a line in $what (req $repeat_idx)");
        } else {
            Test::More::fail("$name - pattern \"$p\" should match a line in $what (req $repeat_idx)");
        }
    }
}

# One test per pattern that matches no line; one failure per matching line.
sub expect_no_lines {
    my ($name, $what, $lines, $value, $repeat_idx) = @_;
    for my $pat (@{ patterns_of($value) }) {
        my $p = printable("$pat");
        my $matched = 0;
        for my $i (0 .. $#$lines) {
            next unless line_matches($lines->[$i], $pat);
            $matched++;
            my @context = @$lines[$i + 1 .. min($i + 9, $#$lines)];
            Test::More::fail("$name - pattern \"$p\" should not match any line in $what "
                . "but matches line \"" . printable($lines->[$i]) . "\" (req $repeat_idx)\n"
                . join('', @context));
        }
        Test::More::pass("$name - pattern \"$p\" does not match a line in $what (req $repeat_idx)")
            unless $matched;
    }
}

sub mentions {
    my ($value, $needle) = @_;
    return 0 unless defined $value;
    return grep { index("$_", $needle) >= 0 } @{ patterns_of($value) };
}

sub check_error_log {
    my ($block, $repeat_idx, $need_array) = @_;
    my $name = $block->name;
    my $lines;

    my $grep = $block->grep_error_log;
    if (defined $grep) {
        $grep = $grep->[$repeat_idx] if ref $grep eq 'ARRAY';
        my $expected = $block->grep_error_log_out;
        bail_out("$name - --- grep_error_log needs --- grep_error_log_out") unless defined $expected;
        $expected = $expected->[$repeat_idx] if ref $expected eq 'ARRAY';

        $lines //= error_log_lines();
        my $matched = '';
        for my $line (@$lines) {
            if (ref $grep ? $line =~ /$grep/ : $line =~ /\Q$grep\E/) {
                $matched .= "$&\n" if $& !~ /\n/;
            }
        }
        is_str($matched, $expected, "$name - grep_error_log_out (req $repeat_idx)");
    } elsif (defined $block->grep_error_log_out) {
        bail_out("$name - --- grep_error_log_out needs --- grep_error_log");
    }

    if (defined $block->error_log) {
        $lines //= error_log_lines();
        expect_lines($name, 'error.log', $lines, scalar($block->error_log), $repeat_idx);
    }
    if (defined $block->no_error_log) {
        $lines //= error_log_lines();
        expect_no_lines($name, 'error.log', $lines, scalar($block->no_error_log), $repeat_idx);
    }

    # Serious messages nobody asked about are shown, as upstream does.
    $lines //= error_log_lines();
    for my $level (qw(alert crit emerg)) {
        next if mentions(scalar($block->error_log), "[$level") || mentions(scalar($block->no_error_log), "[$level");
        for my $line (@$lines) {
            warn "WARNING: $name - " . printable($line) . "\n" if $line =~ /\[$level\]/;
        }
    }
    for my $line (@$lines) {
        Test::More::fail("$name - " . printable($line)) if $line =~ /\bAssertion .*?failed\b/;
    }
}

sub check_access_log {
    my ($block, $repeat_idx) = @_;
    my $name = $block->name;
    my $lines;

    if (defined $block->access_log) {
        $lines //= access_log_lines();
        expect_lines($name, 'access.log', $lines, scalar($block->access_log), $repeat_idx);
    }
    if (defined $block->no_access_log) {
        $lines //= access_log_lines();
        expect_no_lines($name, 'access.log', $lines, scalar($block->no_access_log), $repeat_idx);
    }
}

# ---------------------------------------------------------------------------
# Helpers.

# "1.5", "1.5s" or "200ms" in seconds.
sub parse_time {
    my ($t) = @_;
    return undef unless defined $t;
    return $1 / 1000 if $t =~ /^\s*([\d.]+)\s*ms\s*$/;
    return $1 if $t =~ /^\s*([\d.]+)\s*s?\s*$/;
    return $t;
}

# A port on $ServerAddr nothing listens on, not in %$used.
sub free_port {
    my ($used) = @_;
    for (1 .. 1000) {
        my $port = 1985 + int rand 63000;
        next if $used->{$port};
        my $sock = IO::Socket::INET->new(
            LocalAddr => $ServerAddr, LocalPort => $port, Proto => 'tcp', ReuseAddr => 1,
        ) or next;
        close $sock;
        return $port;
    }
    return undef;
}

sub check_nginx_binary {
    my $out = `"$NginxBinary" -V 2>&1`;
    if (!defined $out || $? != 0) {
        bail_out("cannot run the nginx binary '$NginxBinary' (TEST_NGINX_BINARY): "
            . ($out // $!));
    }
}

sub cleanup {
    return if $$ != $MainPid;
    $_->() for @CleanupHandlers;
    @CleanupHandlers = ();
    return if $ENV{TEST_NGINX_NO_CLEAN};
    stop_running_nginx('cleanup');
    undef $PrevConfig;
}

# Interrupted runs must not leave nginx behind.
for my $sig (qw(INT TERM HUP)) {
    $SIG{$sig} = sub { cleanup(); exit 1 };
}

END {
    if ($$ == $MainPid) {
        local $?;
        cleanup();
        # A randomized server root goes away when everything passed.
        if ($Randomize && !$ENV{TEST_NGINX_NO_CLEAN} && $ServRoot =~ m{/t/servroot_\d+$}
            && Test::More->builder->is_passing)
        {
            remove_tree($ServRoot);
        }
    }
}

1;
