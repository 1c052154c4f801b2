"""speccli chat: templated conversation, the session loop and its live view."""
