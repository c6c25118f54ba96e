"""Who is calling and what they may do (access), signing up and in (signup), the rate limits
on those (ratelimit), and the emails the gateway sends (mailer)."""
