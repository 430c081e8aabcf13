-- Step 3: an API key's LLM token quota (issue 27), in tokens per second (NULL: unlimited).
-- The quota is enforced over a moving window of 60 s (quarry/api/access.py TokenQuota).
ALTER TABLE api_keys ADD COLUMN token_rate DOUBLE PRECISION;
