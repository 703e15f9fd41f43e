//! relay-svc: the HTTP front that orchestrates select, lease, upstream call and failover (issue 5; not built yet).
