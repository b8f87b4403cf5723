"""`stabletrain replay`: a recorded metrics history through the agent's SignalMonitor and the
operator's policy engine, the very code the live job runs."""
