package partnerapi

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// wireSupported: the lean report path runs where a peeker can peek.
const wireSupported = true

// peeker tells whether an idle keep-alive connection is still open: a
// non-blocking peek finds nothing to read (EAGAIN). End of stream (the
// server closed it), unexpected bytes or an error mean it is not. It is
// made once per connection, so that a check allocates nothing.
type peeker struct {
	rc   syscall.RawConn // nil: cannot peek, never alive
	ok   bool
	b    [1]byte
	read func(fd uintptr) bool
}

func newPeeker(nc net.Conn) *peeker {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	p := &peeker{}
	if sc, ok := nc.(syscall.Conn); ok {
		p.rc, _ = sc.SyscallConn()
	}
	p.read = func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), p.b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		p.ok = errors.Is(err, syscall.EAGAIN)
		return true
	}
	return p
}

func (p *peeker) alive() bool {
	if p == nil || p.rc == nil {
		return false
	}
	p.ok = false
	return p.rc.Read(p.read) == nil && p.ok
}
