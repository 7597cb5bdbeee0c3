"""The pre-training wing: the runner, its compiled steps, what it reports and how it resumes."""
