package relay_test

import "time"

// t0 is the manual clocks' start (as in relay's own tests).
var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
