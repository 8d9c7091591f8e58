# nginx against a root that gives every limiter its own sync token
# (`limiter_tokens_file`): a host syncing with its own token as its own id
# is served and limits; a host sending another host's token is refused
# with 403 and its error log says why.

use Test::Nginx::Socket 'no_plan';
use FindBin ();
use lib "$FindBin::Bin/helpers";
use File::Temp ();
use JSON::PP ();
use SluiceTest qw(start_root stop_root root_call);

our $Dir = File::Temp::tempdir(CLEANUP => 1);
sub write_file {
    my ($name, $text) = @_;
    open my $fh, '>', "$Dir/$name" or die $!;
    print $fh $text;
    close $fh;
}
write_file('limiters.tokens', "# limiter_id token\nweb-1 tok-web-1\nweb-2 tok-web-2\n");
write_file('web-1.token', "tok-web-1\n");
our $Root = start_root(args => ['--limiter-tokens-file', "$Dir/limiters.tokens"]);
END { stop_root($Root) }

$ENV{TEST_NGINX_ROOT_URL} = $Root->{url};
$ENV{TEST_NGINX_WEB1_TOKEN} = "$Dir/web-1.token";

add_block_preprocessor(\&SluiceTest::load_sluice_module);

no_shuffle();
no_root_location();
run_tests();

sub put_quota {
    my ($name, $body) = @_;
    my ($status, $reply) = root_call($Root, 'PUT', "/v1/quotas/$name", $body);
    Test::More::ok($status >= 200 && $status < 300, "root accepted quota $name ($status)")
        or Test::More::diag(JSON::PP->new->allow_nonref->encode($reply));
}

__DATA__

=== TEST 1: a host with its own token, as itself, syncs and limits
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
sluice_host_id web-1;
sluice_sync_token_file $TEST_NGINX_WEB1_TOKEN;
--- config
location /t/ { alias html/; sluice tokened; }
--- init
main::put_quota('tokened', { limit => 0, low_burst => 1, high_burst => 1 });
sleep 1.5;
--- request eval
["GET /t/index.html", "GET /t/index.html"]
--- error_code eval
[200, 429]
--- no_error_log
unreachable



=== TEST 2: another host's token is refused (403) and the log says why
--- http_config
sluice_root $TEST_NGINX_ROOT_URL;
sluice_sync_interval 200ms;
sluice_host_id web-2;
sluice_sync_token_file $TEST_NGINX_WEB1_TOKEN;
--- config
location /t/ { alias html/; sluice tokened; }
--- request
GET /t/index.html
--- wait: 1.5
--- error_log eval
qr/\[warn\] .*sluice: quota root http:\/\/127\.0\.0\.1:\d+ unreachable: .*403.*cannot sync as/
