"""(being written)"""

RULES: list = []
