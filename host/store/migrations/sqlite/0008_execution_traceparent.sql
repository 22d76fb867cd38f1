-- The W3C trace context of the request that created an execution, stamped on all its events.
ALTER TABLE executions ADD COLUMN traceparent TEXT;
