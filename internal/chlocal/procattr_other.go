//go:build !linux

package chlocal

import "syscall"

// procAttr puts the server in its own process group (a terminal's Ctrl-C is
// for playpipe, which stops the server in order).
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
