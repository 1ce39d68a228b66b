package kafkanode

import "syscall"

// procAttr puts the JVM in its own process group (a terminal's Ctrl-C is for
// the test) and kills it if the parent dies.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
