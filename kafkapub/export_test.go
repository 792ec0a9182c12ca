package kafkapub

// SetTxnHook makes the transactional publisher p call f at the steps of
// each transaction ("added": partitions added, nothing produced;
// "produced": every record appended, not committed), from the Publish
// goroutine. Set it before the publisher is used.
func SetTxnHook(p *Publisher, f func(bucket int, step string)) { p.txn.hook = f }
