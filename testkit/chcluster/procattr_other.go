//go:build !linux

package chcluster

import "syscall"

// procAttr puts ZooKeeper in its own process group.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
