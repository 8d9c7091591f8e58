# Self-tests of the Test::Nginx runner in t/lib, using plain nginx features
# only. They pass under upstream Test::Nginx too: that is the point.
# t/002-runner-fails.t checks the other half: that failures are reported.

use Test::Nginx::Socket;

repeat_each(2);

# Per repetition: each request has one status check; plus one test per
# header, body and log pattern; must_die has one check and its patterns.
plan tests => repeat_each() * 30;

no_shuffle();
run_tests();

__DATA__

=== TEST 1: status code, extra request headers, response headers and body
--- config
location = /echo {
    add_header X-Seen "$http_x_test" always;
    return 201 "got $http_x_test from $host\n";
}
--- more_headers
X-Test: abc
--- request
GET /echo
--- error_code: 201
--- response_headers
X-Seen: abc
Content-Type: text/plain
!X-Absent
--- response_body
got abc from localhost



=== TEST 2: pipelined requests on one connection, expectations as arrays
--- config
location = /a { return 200 "a\n"; }
location = /b { return 403; }
--- pipelined_requests eval
["GET /a", "GET /b", "GET /nope"]
--- error_code eval
[200, 403, 404]
--- response_body eval
["a\n", qr/403 Forbidden/, qr/404 Not Found/]



=== TEST 3: error_log and no_error_log, as text lines and as eval'd patterns
--- config
location /files/ {
    root html;
}
--- request
GET /files/missing.txt
--- error_code: 404
--- error_log eval
[qr{open\(\) "[^"]+/files/missing\.txt" failed \(2: No such file or directory\)}, "[error]"]
--- no_error_log
[alert]
[emerg]



=== TEST 4: request eval, a request body and response_body_like
--- config
location = /len {
    return 200 "length=$content_length method=$request_method\n";
}
--- request eval
"POST /len\n" . "x" x 5
--- response_body_like: ^length=5 method=POST$



=== TEST 5: user_files, init and wait
--- config
location /docs/ {
    root html;
}
--- user_files
>>> docs/a.txt
first file
>>> docs/b.txt
second file
--- init
open my $fh, '>', html_dir() . "/docs/from-init.txt" or die $!;
print $fh "written by init\n";
close $fh;
--- request eval
["GET /docs/b.txt", "GET /docs/from-init.txt", "HEAD /docs/a.txt"]
--- wait: 0.1
--- response_body eval
["second file\n", "written by init\n", ""]
--- response_headers eval
["Content-Length: 12", "Content-Length: 16", "Content-Length: 11"]
--- error_code eval
[200, 200, 200]



=== TEST 6: a configuration nginx refuses
--- config
sluice_no_such_directive on;
--- must_die
--- error_log
[emerg]
unknown directive "sluice_no_such_directive"
