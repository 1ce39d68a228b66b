package chcluster

import "syscall"

// procAttr kills ZooKeeper if its owner dies.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
