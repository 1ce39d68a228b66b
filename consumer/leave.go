package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/playpipe/playpipe/internal/kafkax"
)

// closeSession closes a Kafka session's client (kafkax.CloseClient: a
// bounded leave) and keeps its group member id for the next session,
// which removes that member should the leave not have got through.
func (e *Enricher) closeSession(sess *kgo.GroupTransactSession) {
	e.prevMember, _ = sess.Client().GroupMetadata()
	kafkax.CloseClient(sess.Client(), 0) // bounded leave: never waits on a frozen broker
}

// leavePrevious removes the group member of the previous Kafka session (if
// any) through cl, the new session's client. The previous client leaves
// the group as it closes, but that leave is bounded and lost when the
// coordinator does not answer in time (frozen, killed, cut off): the broker
// would then keep the member until its session timeout, and the new
// session's join would wait that long, since a rebalance waits for every
// member it knows. With a static instance id (kafkax.Config.InstanceID) the
// new join replaces the old member by itself: nothing is sent. A failure is
// logged: the broker still drops the member after its session timeout.
func (e *Enricher) leavePrevious(ctx context.Context, cl *kgo.Client) {
	member := e.prevMember
	e.prevMember = ""
	if member == "" || e.opts.Kafka.InstanceID != "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, kafkax.DefaultLeaveTimeout)
	defer cancel()
	if err := leaveFor(ctx, cl, e.opts.Group, member); err != nil {
		e.opts.Logger.Info("the previous Kafka session's group member was not removed: the broker drops it after its session timeout",
			"group", e.opts.Group, "member_id", member, "err", err)
	}
}

// leaveReason is the reason leaveFor gives the coordinator.
const leaveReason = "replaced by a new Kafka session of the same enricher"

// leaveFor asks the group coordinator to remove member from group. A member
// that has left already (UNKNOWN_MEMBER_ID) is not an error.
func leaveFor(ctx context.Context, cl *kgo.Client, group, member string) error {
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	req.MemberID = member // LeaveGroup v0–2
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID = member
	m.Reason = kmsg.StringPtr(leaveReason)
	req.Members = append(req.Members, m)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("consumer: leave group %q for member %s: %w", group, member, err)
	}
	errs := []error{kerr.ErrorForCode(resp.ErrorCode)}
	for _, rm := range resp.Members {
		errs = append(errs, kerr.ErrorForCode(rm.ErrorCode))
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, kerr.UnknownMemberID) {
			return fmt.Errorf("consumer: leave group %q for member %s: %w", group, member, err)
		}
	}
	return nil
}
