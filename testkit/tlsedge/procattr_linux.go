package tlsedge

import "syscall"

// procAttr kills nginx if the parent dies.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
