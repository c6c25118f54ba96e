"""TODO"""

from gateway.dashboard.pages import Pages

pages = Pages()
