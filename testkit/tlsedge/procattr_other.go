//go:build !linux

package tlsedge

import "syscall"

// procAttr: no parent-death signal outside Linux.
func procAttr() *syscall.SysProcAttr { return nil }
