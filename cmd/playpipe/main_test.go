package main

import (
	"os"
	"testing"
)

// TestMain gives every role run by these tests an admin server on a free
// loopback port instead of its fixed default, so tests never collide with
// each other or with a playpipe running on the machine.
func TestMain(m *testing.M) {
	if os.Getenv("PLAYPIPE_ADMIN_ADDR") == "" {
		os.Setenv("PLAYPIPE_ADMIN_ADDR", "127.0.0.1:0")
	}
	os.Exit(m.Run())
}
