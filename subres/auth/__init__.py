"""Identity and permission: who the caller is and what they may open."""
