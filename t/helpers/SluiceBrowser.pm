# A headless Chromium driven over the W3C WebDriver protocol, for the
# console test: Debian's `chromium` started by Debian's `chromedriver`
# (same version, both from apt; nothing downloads a browser). Core Perl
# only: HTTP::Tiny and JSON::PP.

package SluiceBrowser;

use strict;
use warnings;

use File::Temp ();
use HTTP::Tiny;
use JSON::PP ();
use MIME::Base64 ();
use POSIX ':sys_wait_h';
use Time::HiRes qw(sleep time);

use SluiceTest qw(free_port);

# The key W3C WebDriver uses for an element reference.
my $ELEMENT = 'element-6066-11e4-a52e-4f735466cecf';

my $json = JSON::PP->new->utf8->canonical->allow_nonref;

# Starts chromedriver and a browser session; dies with a clear message
# when the packages are missing (make deps installs them).
sub start {
    my ($class, %opt) = @_;
    my $driver = $opt{driver} // $ENV{SLUICE_CHROMEDRIVER} // '/usr/bin/chromedriver';
    my $browser = $opt{browser} // $ENV{SLUICE_CHROMIUM} // '/usr/bin/chromium';
    for ([$driver, 'chromium-driver'], [$browser, 'chromium']) {
        die "$_->[0] not found: install the Debian package $_->[1] (make deps)\n" unless -x $_->[0];
    }
    my $dir = File::Temp::tempdir(CLEANUP => 1);
    my $port = free_port();
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>>', "$dir/chromedriver.log";
        open STDERR, '>>', "$dir/chromedriver.log";
        exec $driver, "--port=$port" or POSIX::_exit(127);
    }
    my $self = bless {
        url => "http://127.0.0.1:$port", pid => $pid, dir => $dir,
        http => HTTP::Tiny->new(timeout => 60),
    }, $class;
    my $deadline = time + 20;
    until (eval { $self->call(GET => '/status')->{ready} }) {
        if (time > $deadline || waitpid($pid, WNOHANG) == $pid) {
            $self->stop;
            die "chromedriver did not start; see $dir/chromedriver.log\n";
        }
        sleep 0.1;
    }
    my ($w, $h) = @{ $opt{window} // [1400, 1000] };
    my $session = $self->call(POST => '/session', { capabilities => { alwaysMatch => {
        browserName => 'chrome',
        'goog:chromeOptions' => {
            binary => $browser,
            args => [
                '--headless', '--no-sandbox', '--disable-gpu',
                '--disable-background-networking', '--disable-component-update',
                '--disable-sync', '--disable-dev-shm-usage', '--no-first-run',
                "--user-data-dir=$dir/profile", "--window-size=$w,$h",
            ],
        },
    } } });
    $self->{session} = $session->{sessionId} or die "no WebDriver session\n";
    return $self;
}

# One WebDriver command; returns its `value`, dies with the driver's error.
sub call {
    my ($self, $method, $path, $body) = @_;
    my %args = (headers => { 'Content-Type' => 'application/json' });
    $args{content} = $json->encode($body // {}) if $method eq 'POST';
    my $res = $self->{http}->request($method, "$self->{url}$path", \%args);
    my $reply = eval { $json->decode($res->{content}) } // {};
    my $value = $reply->{value};
    if (!$res->{success}) {
        my $error = ref $value eq 'HASH' ? "$value->{error}: $value->{message}" : $res->{content};
        die "WebDriver $method $path: $res->{status} $error\n";
    }
    return $value;
}

sub session_call {
    my ($self, $method, $path, $body) = @_;
    return $self->call($method, "/session/$self->{session}$path", $body);
}

# Opens a URL.
sub get {
    my ($self, $url) = @_;
    $self->session_call(POST => '/url', { url => $url });
}

# Runs JavaScript in the page (`arguments` are @args); returns its value.
sub js {
    my ($self, $script, @args) = @_;
    return $self->session_call(POST => '/execute/sync', { script => $script, args => \@args });
}

# The element matching a CSS selector (dies when there is none).
sub find {
    my ($self, $css) = @_;
    my $found = $self->session_call(POST => '/element', { using => 'css selector', value => $css });
    return $found->{$ELEMENT};
}

sub click {
    my ($self, $css) = @_;
    my $id = $self->find($css);
    $self->session_call(POST => "/element/$id/click");
}

# Replaces the text of an input, as a user typing.
sub type {
    my ($self, $css, $text) = @_;
    my $id = $self->find($css);
    $self->session_call(POST => "/element/$id/clear");
    $self->session_call(POST => "/element/$id/value", { text => $text });
}

# Polls a JavaScript expression until it is truthy; returns its value,
# or undef after $timeout seconds.
sub wait_for {
    my ($self, $expression, $timeout) = @_;
    my $deadline = time + ($timeout // 15);
    while (1) {
        my $value = eval { $self->js("return ($expression);") };
        return $value if $value;
        return undef if time > $deadline;
        sleep 0.1;
    }
}

# Saves a PNG of the window.
sub screenshot {
    my ($self, $path) = @_;
    my $png = MIME::Base64::decode_base64($self->session_call(GET => '/screenshot'));
    open my $fh, '>:raw', $path or die "$path: $!";
    print $fh $png;
    close $fh;
    return length $png;
}

# Ends the session and chromedriver (which ends the browser).
sub stop {
    my ($self) = @_;
    eval { $self->call(DELETE => "/session/$self->{session}") } if $self->{session};
    delete $self->{session};
    return unless $self->{pid};
    kill 'TERM', $self->{pid};
    for (1 .. 50) {
        last if waitpid($self->{pid}, WNOHANG) == $self->{pid};
        sleep 0.1;
    }
    kill 'KILL', $self->{pid} if kill 0, $self->{pid};
    waitpid($self->{pid}, 0);
    delete $self->{pid};
}

sub DESTROY { $_[0]->stop }

1;
