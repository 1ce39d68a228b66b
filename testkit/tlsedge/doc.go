// Package tlsedge runs the partner's edge for tests and tools/chaos: Debian's
// nginx as a child process terminating TLS on a loopback port and proxying
// to an upstream (the partner sandbox), with a certificate authority of the
// run's own.
//
// WriteCerts writes the CA and a server certificate for 127.0.0.1 signed by
// it: cert.pem (the server certificate followed by the CA), key.pem and
// ca.pem (the CA alone); a Go client trusts Certs.Pool, a child process
// SSL_CERT_FILE=ca.pem.
//
// Start writes nginx.conf into Config.Dir (nginx's prefix: its pid file,
// logs/error.log, logs/access.log when Config.AccessLog names a format, and
// its temporary folders) from a fixed skeleton — one worker, an upstream with
// keep-alive, HTTP/1.1 to it — plus the caller's directives at the http, server
// and location levels, starts nginx in the foreground and waits until it
// completes a TLS handshake. It asks Config.Addr for another port when nginx
// cannot start on the one given (taken meanwhile). The process is stopped by
// its PID (SIGTERM, SIGKILL after 5 s) and, on Linux, killed should the
// parent die.
//
// Users: the edge suite (e2e/edge) and tools/chaos.
package tlsedge
