// Package edge holds the edge suite: the whole pipeline against
// the partner API sandbox behind Debian's nginx as the partner's CDN-like
// edge — TLS with a CA the test makes itself, HTTP/2 and HTTP/1.1,
// keep-alive limits, gzip, unbuffered chunked answers, a 9 000-byte response
// header, the edge's own 413 and 502 pages, the edge reloaded and restarted
// mid-run — and the slow partner whose answers come after the reporter's
// timeout. nginx runs as a process of the test with its
// own prefix, configuration, pid file and error log in a temporary folder,
// on loopback, and is stopped by PID.
//
// TestEdge (edge_test.go, with the nginx configuration of nginx_test.go)
// runs one variant of the edge per subtest; TestSlowPartnerCopies
// (slow_test.go) is the slow partner. Each run compares what the partner received, play by play, with the
// plays expected from the published events, and checks the promise the
// audit rests on: the partner's duplicates are no more than the plays
// labelled in doubt, and no more than the audit's bound on extra copies.
//
// TestEdge413Parked runs `playpipe report` and `playpipe sink` as
// processes behind an edge whose client_max_body_size refuses one oversized
// report with nginx's own 413 page: the report is parked (a Delivery record
// with the 413), listed by `playpipe audit --list parked`, and delivered
// exactly once by `playpipe redrive --parked` after the limit is raised.
//
// Without nginx the tests skip, unless PLAYPIPE_REQUIRE_NGINX=1 (`make
// test`, which installs it) makes that a failure.
package edge
