package analytics

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestWritesBounded: a write to a server that accepts the connection but
// never reads fails with a timeout once the socket buffers are full,
// instead of blocking for good (the chunked insert's Flush has no other
// bound).
func TestWritesBounded(t *testing.T) {
	defer func(d time.Duration) { writeTimeout = d }(writeTimeout)
	writeTimeout = 200 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() { // owner: this test; ends when the listener closes
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := dialer(time.Second, nil)(context.Background(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer func() {
		select {
		case s := <-accepted:
			s.Close()
		default:
		}
	}()
	buf := make([]byte, 1<<20)
	start := time.Now()
	for time.Since(start) < 30*time.Second {
		if _, err = c.Write(buf); err != nil {
			break
		}
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("writing to a server that never reads: %v after %v, want a deadline error", err, time.Since(start).Round(time.Millisecond))
	}
}
