//go:build !linux

package kafkanode

import "syscall"

// procAttr puts the JVM in its own process group.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
