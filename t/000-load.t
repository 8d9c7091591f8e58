# The sluice module loads into our nginx, which then serves as usual.
#
# Needs TEST_NGINX_BINARY (our nginx 1.28; Debian's refuses the module) and
# TEST_NGINX_SLUICE_MODULE (the .so); `make test-nginx` sets both.

use Test::Nginx::Socket 'no_plan';
use FindBin ();

$ENV{TEST_NGINX_SLUICE_MODULE} ||=
    "$FindBin::Bin/../build/nginx/modules/ngx_http_sluice_module.so";

# Production shape: a master process and more than one worker.
master_on();
workers(2);
no_shuffle();
run_tests();

__DATA__

=== TEST 1: nginx loads the module and serves a static file
--- main_config
load_module $TEST_NGINX_SLUICE_MODULE;
--- config
location = /hello.txt {
    root html;
}
--- user_files
>>> hello.txt
hello from sluice
--- request
GET /hello.txt
--- response_body
hello from sluice
--- no_error_log
[error]
[alert]
[emerg]



=== TEST 2: the module registers itself as ngx_http_sluice_module
Loading the same .so twice is refused with the module's own name.
--- main_config
load_module $TEST_NGINX_SLUICE_MODULE;
load_module $TEST_NGINX_SLUICE_MODULE;
--- config
--- must_die
--- error_log
[emerg]
module "ngx_http_sluice_module" is already loaded
