package chlocal

import (
	"net"
	"strconv"
)

// SetSystemDirs replaces the folders searched after PATH (tests only).
func SetSystemDirs(dirs []string) (restore func()) {
	old := systemDirs
	systemDirs = dirs
	return func() { systemDirs = old }
}

// HTTPAddr returns the HTTP interface address, 127.0.0.1:port.
func (s *Server) HTTPAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.httpPort))
}

// Running reports whether the server process is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.owned {
		return true
	}
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}
