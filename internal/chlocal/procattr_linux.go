package chlocal

import "syscall"

// procAttr puts the server in its own process group (a terminal's Ctrl-C is
// for playpipe, which stops the server in order) and kills it if playpipe dies.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
